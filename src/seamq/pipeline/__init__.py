"""The data pipeline on Apache Spark (PySpark): JetStream source, event lake, KPIs, reconcile, lake replay.

Never imported by the workers: Spark is an optional, heavy dependency.
"""
