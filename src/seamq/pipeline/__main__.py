"""`python -m seamq.pipeline ...` is `seamq pipeline ...`, and this file is the script to give
`spark-submit`, which then decides the master and the Spark settings:

    spark-submit --master spark://spark.internal:7077 --conf spark.pyspark.python=python3 \\
        "$(python -c 'import seamq.pipeline.__main__ as m; print(m.__file__)')" kpis --out kpis/
"""

import sys

if __name__ == "__main__":  # a face, run as a script: the pipeline package itself never imports the CLI
    from seamq.cli import main

    main(["pipeline", *sys.argv[1:]])
