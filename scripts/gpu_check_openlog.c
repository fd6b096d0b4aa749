/* SPDX-License-Identifier: Apache-2.0
 *
 * gpu_check_openlog.c - an LD_PRELOAD shim for scripts/gpu-check-prepare.sh:
 * logs every path the process opens (OPENLOG_FILE), so the prepare script
 * learns which kernel headers BCC's compile of ingero's programs reads and
 * ships only those (~150 files, ~0.25 MB xz, against ~12 MB of Debian's
 * header packages) to the GPU machine, which cannot fetch packages.
 * OPENLOG_PREFIX: only paths starting with it (unset: every path).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void note(const char *path) {
	const char *log = getenv("OPENLOG_FILE"), *want = getenv("OPENLOG_PREFIX");
	if (!log || !path || (want && strncmp(path, want, strlen(want)))) return;
	int fd = ((int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open"))(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
	if (fd < 0) return;
	dprintf(fd, "%s\n", path);
	close(fd);
}
int open(const char *p, int f, ...) { va_list a; va_start(a, f); int m = va_arg(a, int); va_end(a); note(p);
	return ((int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open"))(p, f, m); }
int open64(const char *p, int f, ...) { va_list a; va_start(a, f); int m = va_arg(a, int); va_end(a); note(p);
	return ((int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open64"))(p, f, m); }
int openat(int d, const char *p, int f, ...) { va_list a; va_start(a, f); int m = va_arg(a, int); va_end(a); note(p);
	return ((int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat"))(d, p, f, m); }
int openat64(int d, const char *p, int f, ...) { va_list a; va_start(a, f); int m = va_arg(a, int); va_end(a); note(p);
	return ((int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat64"))(d, p, f, m); }
