"""What ``dg scaffold defs dagster_sideinputs.SideInputPipeline <path>`` writes.

A ``defs.yaml`` declaring a keyed enrichment (``orders`` joined with ``customers`` by
``customer_id``, orders of unknown customers routed to ``unmatched_orders``) and the
``pipeline.py`` holding the function it names. ``dg check defs`` accepts it as written;
it materializes once the project has the ``orders`` and ``customers`` assets.
"""

from pathlib import Path

import dagster as dg

DEFS_YAML = """\
type: {type_name}

attributes:
  # The operator's function: pipeline.py, next to this file.
  fn: .pipeline:enrich_orders

  # The main input, read incrementally: a Delta table asset that grows by appends.
  main:
    asset: orders
    key: customer_id

  # Side inputs by the name the function uses; view: singleton | list | map | multimap.
  side_inputs:
    customer:
      view: map
      asset: customers
      key: customer_id
      missing: unmatched     # or {{wait: 1h, then: unmatched}}, or null

  main_output: enriched_orders
  routes:
    unmatched: unmatched_orders

  # The Spark session and where the tables live. Remove this block when the project
  # defines `spark` and `io_manager` resources itself. Give the project's Definitions
  # `executor=dg.in_process_executor`: a run's steps then share one Spark session
  # (Dagster's default executor starts a JVM per step).
  resources:
    spark:
      master: local[2]
    io_manager:
      root: "{{{{ context.project_root }}}}/data"
"""

PIPELINE_PY = '''\
"""The function of the side-input pipeline declared in defs.yaml."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import dagster_sideinputs as dsi


def enrich_orders(main: DataFrame, sides: dsi.SideInputs) -> dsi.Outputs:
    """Each order with its customer's row, joined as the struct column ``customer``."""
    return main.withColumn("customer_name", F.col("customer.name")).drop("customer")
'''


def write_template(target: Path, type_name: str) -> None:
    """Write the template's ``defs.yaml`` and ``pipeline.py`` into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    (target / "defs.yaml").write_text(DEFS_YAML.format(type_name=type_name))
    (target / "pipeline.py").write_text(PIPELINE_PY)


class SideInputPipelineScaffolder(dg.Scaffolder):
    """Scaffolds a ``SideInputPipeline``: ``defs.yaml`` and ``pipeline.py``."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        write_template(Path(request.target_path), request.type_name)
