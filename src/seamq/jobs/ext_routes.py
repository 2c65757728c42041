"""The extension routes: job progress (`urn:ojs:ext:progress`), the schema registry
(`urn:ojs:ext:schema-registry`) and checkpoints (`urn:ojs:ext:durable-execution`), each as both the
conformance suites and the SDKs address them."""

from __future__ import annotations

from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from seamq.jobs import checkpoints, ext, schemas
from seamq.jobs.api import answer, body_of
from seamq.jobs.engine import Engine
from seamq.jobs.model import OjsError, utcnow
from seamq.jobs.routes import page


SDK_CHECKPOINTS = ("/ojs/v1/checkpoints/{job_id}", "/ojs/v1/ojs/v1/checkpoints/{job_id}")


def extensions(engine: Engine) -> list[Route]:
    registry = engine.schemas

    async def report_progress(request: Request) -> Response:  # the suite: PUT /jobs/{id}/progress
        return answer(await ext.report_progress(engine.ops, engine.events, request.path_params["job_id"],
                                                  await body_of(request)))

    async def worker_progress(request: Request) -> Response:  # the SDKs: POST /workers/progress
        body = await body_of(request)
        return answer(await ext.report_progress(engine.ops, engine.events, body.get("job_id"), body))

    async def progress(request: Request) -> Response:
        return answer(ext.progress_of(await engine.ops.record(request.path_params["job_id"])))

    async def save_checkpoint(request: Request) -> Response:  # the suite: PUT; the spec and the SDKs: POST
        return answer(await ext.save_checkpoint(engine.ops, engine.events, request.path_params["job_id"],
                                                await body_of(request)))

    async def checkpoint(request: Request) -> Response:
        job_id, held = await ext.checkpoint_of(engine.ops, request.path_params["job_id"])
        if held is None:
            raise OjsError(404, "not_found", f"job {job_id} has no checkpoint")
        return answer(checkpoints.shown(job_id, held))

    async def resume(request: Request) -> Response:  # the SDKs' durable context, as it starts
        return answer(checkpoints.resume(*await ext.checkpoint_of(engine.ops, request.path_params["job_id"])))

    async def delete_checkpoint(request: Request) -> Response:
        return answer(await ext.delete_checkpoint(engine.ops, request.path_params["job_id"]))

    async def list_schemas(request: Request) -> Response:
        found, pagination = page(registry.list(), request, default=50)
        return answer({"schemas": found, "pagination": pagination})

    async def register(request: Request) -> Response:  # the SDKs: {uri, type, version, schema}
        status, record = await registry.put(schemas.from_sdk(await body_of(request), utcnow()))
        return answer({"schema": record}, status)

    def _uri(request: Request) -> str:
        return unquote(request.path_params["uri"])

    async def by_uri(request: Request) -> Response:
        return answer({"schema": schemas.public(registry.by_uri(_uri(request)))})

    async def delete_by_uri(request: Request) -> Response:
        return answer(await registry.delete(registry.by_uri(_uri(request))))

    async def put_version(request: Request) -> Response:  # the suite: PUT /admin/schemas/{type}/{version}
        params = request.path_params
        record = schemas.new(params["type"], params["version"], await body_of(request), utcnow())
        status, stored = await registry.put(record)
        return answer(stored, status)

    async def get_version(request: Request) -> Response:
        return answer(registry.get(request.path_params["type"], request.path_params["version"]))

    async def delete_version(request: Request) -> Response:
        found = registry.get(request.path_params["type"], request.path_params["version"])
        return answer(await registry.delete(registry.by_uri(found["uri"])))

    async def latest(request: Request) -> Response:
        return answer(registry.get(request.path_params["type"]))

    async def versions(request: Request) -> Response:
        job_type = request.path_params["type"]
        return answer({"type": job_type, "versions": registry.list(job_type)})

    return [
        Route("/ojs/v1/jobs/{job_id}/progress", report_progress, methods=["PUT", "POST"]),
        Route("/ojs/v1/jobs/{job_id}/progress", progress, methods=["GET"]),
        Route("/ojs/v1/workers/progress", worker_progress, methods=["POST"]),
        # The official SDKs' durable contexts (Python ojs/durable.py, JS durable.ts) put /ojs/v1 before a
        # path their transport prefixes with /ojs/v1 again: served at both, or their checkpoints go nowhere.
        *(route for path in ("/ojs/v1/jobs/{job_id}/checkpoint", *SDK_CHECKPOINTS) for route in (
            Route(path, save_checkpoint, methods=["PUT", "POST"]), Route(path, checkpoint, methods=["GET"]),
            Route(path, delete_checkpoint, methods=["DELETE"]))),
        *(Route(f"{path}/resume", resume, methods=["GET"]) for path in SDK_CHECKPOINTS),
        Route("/ojs/v1/schemas", list_schemas, methods=["GET"]),
        Route("/ojs/v1/schemas", register, methods=["POST"]),
        Route("/ojs/v1/schemas/{uri:path}", by_uri, methods=["GET"]),
        Route("/ojs/v1/schemas/{uri:path}", delete_by_uri, methods=["DELETE"]),
        Route("/ojs/v1/admin/schemas", list_schemas, methods=["GET"]),
        Route("/ojs/v1/admin/schemas/{type}/versions", versions, methods=["GET"]),
        Route("/ojs/v1/admin/schemas/{type}", latest, methods=["GET"]),
        Route("/ojs/v1/admin/schemas/{type}/{version}", put_version, methods=["PUT"]),
        Route("/ojs/v1/admin/schemas/{type}/{version}", get_version, methods=["GET"]),
        Route("/ojs/v1/admin/schemas/{type}/{version}", delete_version, methods=["DELETE"]),
    ]
