"""The data pipeline on Apache Spark (PySpark): JetStream source (more to come: lake, KPIs, reconcile).

Never imported by the workers: Spark is an optional, heavy dependency.
"""
