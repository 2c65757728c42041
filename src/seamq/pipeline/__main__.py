"""`python -m seamq.pipeline ...` is `seamq pipeline ...`, and this file is the script to give
`spark-submit`, which then decides the master and the Spark settings:

    spark-submit --master spark://spark.internal:7077 --conf spark.pyspark.python=python3 \\
        "$(python -c 'import seamq.pipeline.__main__ as m; print(m.__file__)')" kpis --out kpis/
"""

import sys

from seamq.cli import main

if __name__ == "__main__":
    main(["pipeline", *sys.argv[1:]])
