"""Apache Spark (pyspark, local mode, Debian's Java 17) reads the fleet dataset and gets the same
per-node step-time table as DuckDB (`ingero fleet query`).  docs/fleet.md shows the same query."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import prereqs
from ingero.fleet import status
from ingero.fleet.synthetic import NodeSpec, generate

# The straggler query of docs/fleet.md: step time per node, weighted by steps.
STEP_SQL = """
SELECT node, sum(steps) AS steps, round(sum(step_median_ms * steps) / sum(steps), 3) AS step_ms
FROM nodes GROUP BY node ORDER BY node
"""


def test_spark_reads_the_dataset_and_agrees_with_duckdb(tmp_path: Path):
    java = prereqs.needs(shutil.which("java"), "Java (openjdk-17-jre-headless)",
                         "make setup (scripts/setup.sh installs it)")
    pyspark = prereqs.needs(__import__("importlib").util.find_spec("pyspark"), "pyspark", "make setup (the test extra)")
    assert java and pyspark
    from pyspark.sql import SparkSession

    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("node-a", 20.0), NodeSpec("node-b", 41.0), NodeSpec("node-c", 20.4)],
             seconds=180, events_per_node=3000)
    duck, _ = status.query(str(root), STEP_SQL, 100)
    os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)
    spark = (SparkSession.builder.master("local[1]").appName("ingero-fleet-test")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "512m").getOrCreate())
    try:
        for table in ("nodes", "events"):
            spark.read.option("basePath", f"{root}/table={table}").parquet(f"{root}/table={table}") \
                .createOrReplaceTempView(table)
        rows = [tuple(r) for r in spark.sql(STEP_SQL).collect()]
        events = spark.sql("SELECT node, count(*) FROM events GROUP BY node ORDER BY node").collect()
    finally:
        spark.stop()
    assert rows == [tuple(r) for r in duck.rows] == [("node-a", 9000, 20.0), ("node-b", 4389, 41.0),
                                                      ("node-c", 8823, 20.4)]
    assert [tuple(r) for r in events] == [("node-a", 3000), ("node-b", 3000), ("node-c", 3000)]
