"""Where jobs enqueued in the caller's transaction (seamq.jobs.enqueue) go: outbox rows of the `ojs`
context, which the relay publishes to the job server's intake stream with the job id as
Nats-Msg-Id, and the server takes in (it creates the stream). Registered in the topology where it
is loaded (seamq.cli.common), so the relay routes them by the rule it has for every context."""

from seamq.topology import Route

ROUTE = Route(context="ojs", subject="ojs.enqueue", stream="OJS_ENQUEUE",
              owner="seamq's own: jobs enqueued in a transaction (docs/jobs.md)")
