"""What a CUDA call's return code (events.ret) means: its name, and what to do about it.

Three families, by the op that returned it: the runtime's ``cudaError_t`` (cuda* ops), the
driver's ``CUresult`` (cu* ops) and NCCL's ``ncclResult_t`` (nccl* ops).  The numbers are
NVIDIA's, read from the CUDA 13.0 toolkit's ``driver_types.h`` (enum cudaError) and
``cuda.h`` (enum cudaError_enum), and from ``nccl.h`` of the nvidia-nccl-cu12 wheel;
tests/unit/test_failed_calls.py holds the tables to those headers.  0 is success in all
three and is not listed.  A code that is not in its table (a newer runtime's) reads as
``<family> <number>``.
"""

from __future__ import annotations

RUNTIME = {
    1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation", 3: "cudaErrorInitializationError",
    4: "cudaErrorCudartUnloading", 5: "cudaErrorProfilerDisabled", 6: "cudaErrorProfilerNotInitialized",
    7: "cudaErrorProfilerAlreadyStarted", 8: "cudaErrorProfilerAlreadyStopped",
    9: "cudaErrorInvalidConfiguration", 12: "cudaErrorInvalidPitchValue", 13: "cudaErrorInvalidSymbol",
    16: "cudaErrorInvalidHostPointer", 17: "cudaErrorInvalidDevicePointer", 18: "cudaErrorInvalidTexture",
    19: "cudaErrorInvalidTextureBinding", 20: "cudaErrorInvalidChannelDescriptor",
    21: "cudaErrorInvalidMemcpyDirection", 22: "cudaErrorAddressOfConstant",
    23: "cudaErrorTextureFetchFailed", 24: "cudaErrorTextureNotBound", 25: "cudaErrorSynchronizationError",
    26: "cudaErrorInvalidFilterSetting", 27: "cudaErrorInvalidNormSetting",
    28: "cudaErrorMixedDeviceExecution", 31: "cudaErrorNotYetImplemented", 32: "cudaErrorMemoryValueTooLarge",
    34: "cudaErrorStubLibrary", 35: "cudaErrorInsufficientDriver", 36: "cudaErrorCallRequiresNewerDriver",
    37: "cudaErrorInvalidSurface", 43: "cudaErrorDuplicateVariableName", 44: "cudaErrorDuplicateTextureName",
    45: "cudaErrorDuplicateSurfaceName", 46: "cudaErrorDevicesUnavailable",
    49: "cudaErrorIncompatibleDriverContext", 52: "cudaErrorMissingConfiguration",
    53: "cudaErrorPriorLaunchFailure", 65: "cudaErrorLaunchMaxDepthExceeded",
    66: "cudaErrorLaunchFileScopedTex", 67: "cudaErrorLaunchFileScopedSurf", 68: "cudaErrorSyncDepthExceeded",
    69: "cudaErrorLaunchPendingCountExceeded", 98: "cudaErrorInvalidDeviceFunction", 100: "cudaErrorNoDevice",
    101: "cudaErrorInvalidDevice", 102: "cudaErrorDeviceNotLicensed",
    103: "cudaErrorSoftwareValidityNotEstablished", 127: "cudaErrorStartupFailure",
    200: "cudaErrorInvalidKernelImage", 201: "cudaErrorDeviceUninitialized",
    205: "cudaErrorMapBufferObjectFailed", 206: "cudaErrorUnmapBufferObjectFailed",
    207: "cudaErrorArrayIsMapped", 208: "cudaErrorAlreadyMapped", 209: "cudaErrorNoKernelImageForDevice",
    210: "cudaErrorAlreadyAcquired", 211: "cudaErrorNotMapped", 212: "cudaErrorNotMappedAsArray",
    213: "cudaErrorNotMappedAsPointer", 214: "cudaErrorECCUncorrectable", 215: "cudaErrorUnsupportedLimit",
    216: "cudaErrorDeviceAlreadyInUse", 217: "cudaErrorPeerAccessUnsupported", 218: "cudaErrorInvalidPtx",
    219: "cudaErrorInvalidGraphicsContext", 220: "cudaErrorNvlinkUncorrectable",
    221: "cudaErrorJitCompilerNotFound", 222: "cudaErrorUnsupportedPtxVersion",
    223: "cudaErrorJitCompilationDisabled", 224: "cudaErrorUnsupportedExecAffinity",
    225: "cudaErrorUnsupportedDevSideSync", 226: "cudaErrorContained", 300: "cudaErrorInvalidSource",
    301: "cudaErrorFileNotFound", 302: "cudaErrorSharedObjectSymbolNotFound",
    303: "cudaErrorSharedObjectInitFailed", 304: "cudaErrorOperatingSystem",
    400: "cudaErrorInvalidResourceHandle", 401: "cudaErrorIllegalState", 402: "cudaErrorLossyQuery",
    500: "cudaErrorSymbolNotFound", 600: "cudaErrorNotReady", 700: "cudaErrorIllegalAddress",
    701: "cudaErrorLaunchOutOfResources", 702: "cudaErrorLaunchTimeout",
    703: "cudaErrorLaunchIncompatibleTexturing", 704: "cudaErrorPeerAccessAlreadyEnabled",
    705: "cudaErrorPeerAccessNotEnabled", 708: "cudaErrorSetOnActiveProcess",
    709: "cudaErrorContextIsDestroyed", 710: "cudaErrorAssert", 711: "cudaErrorTooManyPeers",
    712: "cudaErrorHostMemoryAlreadyRegistered", 713: "cudaErrorHostMemoryNotRegistered",
    714: "cudaErrorHardwareStackError", 715: "cudaErrorIllegalInstruction", 716: "cudaErrorMisalignedAddress",
    717: "cudaErrorInvalidAddressSpace", 718: "cudaErrorInvalidPc", 719: "cudaErrorLaunchFailure",
    720: "cudaErrorCooperativeLaunchTooLarge", 721: "cudaErrorTensorMemoryLeak", 800: "cudaErrorNotPermitted",
    801: "cudaErrorNotSupported", 802: "cudaErrorSystemNotReady", 803: "cudaErrorSystemDriverMismatch",
    804: "cudaErrorCompatNotSupportedOnDevice", 805: "cudaErrorMpsConnectionFailed",
    806: "cudaErrorMpsRpcFailure", 807: "cudaErrorMpsServerNotReady", 808: "cudaErrorMpsMaxClientsReached",
    809: "cudaErrorMpsMaxConnectionsReached", 810: "cudaErrorMpsClientTerminated",
    811: "cudaErrorCdpNotSupported", 812: "cudaErrorCdpVersionMismatch",
    900: "cudaErrorStreamCaptureUnsupported", 901: "cudaErrorStreamCaptureInvalidated",
    902: "cudaErrorStreamCaptureMerge", 903: "cudaErrorStreamCaptureUnmatched",
    904: "cudaErrorStreamCaptureUnjoined", 905: "cudaErrorStreamCaptureIsolation",
    906: "cudaErrorStreamCaptureImplicit", 907: "cudaErrorCapturedEvent",
    908: "cudaErrorStreamCaptureWrongThread", 909: "cudaErrorTimeout", 910: "cudaErrorGraphExecUpdateFailure",
    911: "cudaErrorExternalDevice", 912: "cudaErrorInvalidClusterSize", 913: "cudaErrorFunctionNotLoaded",
    914: "cudaErrorInvalidResourceType", 915: "cudaErrorInvalidResourceConfiguration",
    999: "cudaErrorUnknown", 10000: "cudaErrorApiFailureBase",
}
DRIVER = {
    1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED", 5: "CUDA_ERROR_PROFILER_DISABLED",
    6: "CUDA_ERROR_PROFILER_NOT_INITIALIZED", 7: "CUDA_ERROR_PROFILER_ALREADY_STARTED",
    8: "CUDA_ERROR_PROFILER_ALREADY_STOPPED", 34: "CUDA_ERROR_STUB_LIBRARY",
    36: "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", 46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE", 102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
    200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT",
    202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", 205: "CUDA_ERROR_MAP_FAILED", 206: "CUDA_ERROR_UNMAP_FAILED",
    207: "CUDA_ERROR_ARRAY_IS_MAPPED", 208: "CUDA_ERROR_ALREADY_MAPPED", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
    210: "CUDA_ERROR_ALREADY_ACQUIRED", 211: "CUDA_ERROR_NOT_MAPPED", 212: "CUDA_ERROR_NOT_MAPPED_AS_ARRAY",
    213: "CUDA_ERROR_NOT_MAPPED_AS_POINTER", 214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    215: "CUDA_ERROR_UNSUPPORTED_LIMIT", 216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
    217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", 218: "CUDA_ERROR_INVALID_PTX",
    219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", 220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    223: "CUDA_ERROR_JIT_COMPILATION_DISABLED", 224: "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY",
    225: "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", 226: "CUDA_ERROR_CONTAINED", 300: "CUDA_ERROR_INVALID_SOURCE",
    301: "CUDA_ERROR_FILE_NOT_FOUND", 302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
    303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", 304: "CUDA_ERROR_OPERATING_SYSTEM",
    400: "CUDA_ERROR_INVALID_HANDLE", 401: "CUDA_ERROR_ILLEGAL_STATE", 402: "CUDA_ERROR_LOSSY_QUERY",
    500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", 704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
    705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", 708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
    709: "CUDA_ERROR_CONTEXT_IS_DESTROYED", 710: "CUDA_ERROR_ASSERT", 711: "CUDA_ERROR_TOO_MANY_PEERS",
    712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", 713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR", 715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS", 717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC", 719: "CUDA_ERROR_LAUNCH_FAILED",
    720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", 721: "CUDA_ERROR_TENSOR_MEMORY_LEAK",
    800: "CUDA_ERROR_NOT_PERMITTED", 801: "CUDA_ERROR_NOT_SUPPORTED", 802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", 804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    805: "CUDA_ERROR_MPS_CONNECTION_FAILED", 806: "CUDA_ERROR_MPS_RPC_FAILURE",
    807: "CUDA_ERROR_MPS_SERVER_NOT_READY", 808: "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
    809: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", 810: "CUDA_ERROR_MPS_CLIENT_TERMINATED",
    811: "CUDA_ERROR_CDP_NOT_SUPPORTED", 812: "CUDA_ERROR_CDP_VERSION_MISMATCH",
    900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    902: "CUDA_ERROR_STREAM_CAPTURE_MERGE", 903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
    904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
    906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 907: "CUDA_ERROR_CAPTURED_EVENT",
    908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", 909: "CUDA_ERROR_TIMEOUT",
    910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", 911: "CUDA_ERROR_EXTERNAL_DEVICE",
    912: "CUDA_ERROR_INVALID_CLUSTER_SIZE", 913: "CUDA_ERROR_FUNCTION_NOT_LOADED",
    914: "CUDA_ERROR_INVALID_RESOURCE_TYPE", 915: "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
    916: "CUDA_ERROR_KEY_ROTATION", 999: "CUDA_ERROR_UNKNOWN",
}
NCCL = {
    1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError", 4: "ncclInvalidArgument",
    5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
}

# ncclInProgress: a non-blocking communicator's call is still running (its init, or an
# enqueue): not a failure.
NCCL_IN_PROGRESS = 7

FAMILIES = (("nccl", "ncclResult_t", NCCL), ("cuda", "cudaError_t", RUNTIME), ("cu", "CUresult", DRIVER))


def _family(op: str) -> tuple[str, dict[int, str]]:
    for prefix, family, table in FAMILIES:
        if op.startswith(prefix):
            return family, table
    return "return code", {}


def name(op: str, ret: int) -> str:
    """The name of ``ret`` as ``op``'s family spells it: 'cudaErrorInsufficientDriver'."""
    family, table = _family(op)
    return table.get(int(ret)) or f"{family} {int(ret)}"


def failed(op: str, ret: int | None) -> bool:
    """The call returned an error (windows.FAILED_CALL_SQL is the same test in SQL)."""
    return bool(ret) and not (op.startswith("nccl") and ret == NCCL_IN_PROGRESS)


# What each kind of failure asks of the user, by name (runtime and driver spell the same code
# differently).  A code not listed gets the generic line (GENERIC_FIX).
_FIXES: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"cudaErrorInsufficientDriver", "cudaErrorCallRequiresNewerDriver",
                "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", "cudaErrorSystemDriverMismatch",
                "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "cudaErrorCompatNotSupportedOnDevice",
                "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"}),
     "the NVIDIA driver is missing, or older than the CUDA runtime the job loaded: install or upgrade it "
     "(`nvidia-smi` prints the driver and the newest CUDA it supports), "
     "or run a build for the installed driver's CUDA"),
    (frozenset({"cudaErrorStubLibrary", "CUDA_ERROR_STUB_LIBRARY"}),
     "the job loaded the toolkit's stub libcuda.so (lib64/stubs, for linking only) instead of the driver's: "
     "take the stubs directory out of LD_LIBRARY_PATH"),
    (frozenset({"cudaErrorNoDevice", "CUDA_ERROR_NO_DEVICE", "cudaErrorInvalidDevice", "CUDA_ERROR_INVALID_DEVICE",
                "cudaErrorDevicesUnavailable", "CUDA_ERROR_DEVICE_UNAVAILABLE"}),
     "no usable GPU for the process: check CUDA_VISIBLE_DEVICES, the container's GPU access (--gpus), "
     "`nvidia-smi`, and a compute mode of Exclusive_Process held by another process"),
    (frozenset({"cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY"}),
     "device memory ran out: a smaller batch, activation checkpointing, or free what other processes hold "
     "(`nvidia-smi --query-compute-apps=pid,used_memory --format=csv`)"),
    (frozenset({"cudaErrorInitializationError", "CUDA_ERROR_NOT_INITIALIZED", "CUDA_ERROR_INVALID_CONTEXT"}),
     "CUDA was not initialised for the calling thread (driver API: cuInit and a current context first; "
     "a process forked after CUDA started cannot use it: start workers with the 'spawn' method)"),
    (frozenset({"cudaErrorCudartUnloading", "CUDA_ERROR_DEINITIALIZED"}),
     "calls made while the process exits (the runtime is unloading): harmless at teardown; elsewhere "
     "the job uses CUDA after cudaDeviceReset or from an exit handler"),
    (frozenset({"cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS", "cudaErrorLaunchFailure",
                "CUDA_ERROR_LAUNCH_FAILED", "cudaErrorIllegalInstruction", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
                "cudaErrorMisalignedAddress", "CUDA_ERROR_MISALIGNED_ADDRESS", "cudaErrorHardwareStackError",
                "CUDA_ERROR_HARDWARE_STACK_ERROR", "cudaErrorInvalidPc", "CUDA_ERROR_INVALID_PC",
                "cudaErrorInvalidAddressSpace", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "cudaErrorAssert",
                "CUDA_ERROR_ASSERT", "cudaErrorLaunchTimeout", "CUDA_ERROR_LAUNCH_TIMEOUT",
                "cudaErrorECCUncorrectable", "CUDA_ERROR_ECC_UNCORRECTABLE", "cudaErrorNvlinkUncorrectable",
                "CUDA_ERROR_NVLINK_UNCORRECTABLE", "cudaErrorPriorLaunchFailure"}),
     "a kernel faulted: the context is lost and every later call returns the same error; find the kernel with "
     "`compute-sanitizer python3 train.py` (or CUDA_LAUNCH_BLOCKING=1 for the failing call's stack)"),
    (frozenset({"cudaErrorNoKernelImageForDevice", "CUDA_ERROR_NO_BINARY_FOR_GPU", "cudaErrorInvalidKernelImage",
                "CUDA_ERROR_INVALID_IMAGE", "cudaErrorInvalidPtx", "CUDA_ERROR_INVALID_PTX",
                "cudaErrorUnsupportedPtxVersion", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"}),
     "the kernels were not built for this GPU (or their PTX is newer than the driver): rebuild for its "
     "architecture (TORCH_CUDA_ARCH_LIST, nvcc -gencode) or upgrade the driver"),
    (frozenset({"cudaErrorInvalidValue", "CUDA_ERROR_INVALID_VALUE", "cudaErrorInvalidResourceHandle",
                "CUDA_ERROR_INVALID_HANDLE", "cudaErrorInvalidDevicePointer", "cudaErrorInvalidHostPointer",
                "cudaErrorInvalidMemcpyDirection", "cudaErrorInvalidConfiguration", "cudaErrorInvalidPitchValue",
                "cudaErrorInvalidSymbol", "cudaErrorInvalidDeviceFunction", "ncclInvalidArgument",
                "ncclInvalidUsage"}),
     "the job passes an invalid argument (a destroyed stream or event, a freed or host pointer, a bad size "
     "or direction): find the call sites: trace with --stack, then `ingero query \"SELECT stack_id, op, ret, "
     "count(*) AS n FROM events WHERE ret <> 0 GROUP BY ALL ORDER BY n DESC\"`"),
    (frozenset({"ncclSystemError", "ncclRemoteError", "ncclUnhandledCudaError", "ncclInternalError"}),
     "NCCL failed (a socket, shared memory, a peer that died, or a CUDA error under it): run with "
     "NCCL_DEBUG=WARN (INFO for the transport) and read the first rank's message"),
)
GENERIC_FIX = ("look the code up in NVIDIA's documentation of its name; find the failing call sites: trace with "
               "--stack, then `ingero query \"SELECT stack_id, op, ret, count(*) AS n FROM events WHERE ret <> 0 "
               "GROUP BY ALL ORDER BY n DESC\"`")


def fix(error_name: str) -> str:
    """What to do about the error called ``error_name`` (one of the tables' names)."""
    for names, text in _FIXES:
        if error_name in names:
            return text
    return GENERIC_FIX


# A session's failed calls, for the end of a trace (the host ops' codes are no CUDA errors:
# block I/O's is the request's).  `ret <> 0` reads only the row groups whose zone maps hold
# a failure.
SESSION_FAILED_SQL = """
SELECT op::VARCHAR, ret, count(*) FROM events
WHERE session_id = $sid AND ret <> 0 AND NOT list_contains($host_ops, op)
GROUP BY ALL
"""


def session_failures(con, session_id: int) -> dict[str, int]:
    """Error name -> calls of the session that returned it, most first."""
    from ingero.events import ops

    out: dict[str, int] = {}
    for op, ret, n in con.execute(SESSION_FAILED_SQL, {"sid": session_id, "host_ops": list(ops.HOST_OPS)}).fetchall():
        if failed(op, ret):
            key = name(op, ret)
            out[key] = out.get(key, 0) + int(n)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))
