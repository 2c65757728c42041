"""The official JS SDK (@openjobspec/sdk 0.4.0, unmodified, built from ../shared/ojs-sdks) against
`seamq jobs serve`: its own integration tests, then every feature its users reach, client and worker.

Each scenario is an ES module run by node beside the built SDK; it prints one JSON object of what it
saw, and the assertions are here. Scenarios wait for what they expect with deadlines, never fixed times.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers.jobs_harness import served
from helpers.sdk_harness import js_sdk, run_node

pytestmark = pytest.mark.timeout(900)

PRELUDE = """
import { OJSClient, OJSWorker, HttpTransport, chain, group, batch, reportProgress } from './dist/esm/index.js';
const url = process.env.OJS_URL;
const client = new OJSClient({ url });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(check, what, ms = 60000) {
  const end = Date.now() + ms;
  for (;;) {
    const found = await check();
    if (found) return found;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}
const stateOf = async (id) => (await client.getJob(id)).state;
const out = {};
"""


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    js_sdk()  # built before the server starts: npm's time is not the server's
    with served(tmp_path_factory, "sdk-js") as found:
        yield found


def scenario(url: str, body: str, name: str) -> dict:
    return run_node(PRELUDE + body + "\nconsole.log(JSON.stringify(out));\nprocess.exit(0);\n",
                    {"OJS_URL": url}, name)


def test_the_sdks_own_integration_tests_pass(url):
    folder = js_sdk()
    config = folder / "vitest.integration.config.ts"  # its own config excludes tests/integration
    config.write_text("import { defineConfig } from 'vitest/config';\n"
                      "export default defineConfig({ test: { include: ['tests/integration/**/*.test.ts'] } });\n")
    done = subprocess.run(["npx", "vitest", "run", "--config", str(config)], cwd=folder, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OJS_INTEGRATION_URL": url, "CI": "1"})
    assert "7 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


def test_client_jobs_queues_unique_schedule_expiry_cron_schemas_dead_letters(url):
    seen = scenario(url, """
const job = await client.enqueue('js.echo', ['a', 1], { queue: 'js-client', priority: 5 });
out.job = [job.state, job.queue, (await client.getJob(job.id)).id === job.id];
out.cancelled = (await client.cancelJob(job.id)).state;
out.batch = (await client.enqueueBatch([0, 1, 2].map((i) => ({ type: 'js.echo', args: [i], options: { queue: 'js-client' } })))).length;
out.queues = (await client.queues.list()).map((q) => q.name);
out.stats = (await client.queues.stats('js-client')).available;
await client.queues.pause('js-client');
out.paused = (await client.queues.stats('js-client')).paused;
await client.queues.resume('js-client');
out.resumed = (await client.queues.stats('js-client')).paused;
await client.enqueue('js.unique', ['u'], { queue: 'js-client', unique: { key: ['type', 'args'], onConflict: 'reject' } });
try { await client.enqueue('js.unique', ['u'], { queue: 'js-client', unique: { key: ['type', 'args'], onConflict: 'reject' } }); out.unique = 'accepted'; }
catch (e) { out.unique = e.constructor.name; }
out.later = (await client.enqueue('js.later', [], { queue: 'js-client', delay: '1h' })).state;
const short = await client.enqueue('js.expiring', [], { queue: 'js-idle', expiresAt: new Date(Date.now() + 1000).toISOString() });
await until(async () => (await stateOf(short.id)) === 'discarded', 'the expired job discarded');
const cron = await client.cron.register({ name: 'js-nightly', cron: '0 3 * * *', type: 'js.report', args: ['x'] });
out.cron = [cron.name, cron.cron, cron.type];
out.crons = (await client.cron.list()).cron_jobs.map((c) => c.name);
await client.cron.unregister('js-nightly');
out.cronsAfter = (await client.cron.list()).cron_jobs.length;
const schema = await client.schemas.register({ uri: 'urn:example:js.mail:1', type: 'js.mail', version: '1.0.0', schema: { type: 'array', items: [{ type: 'string' }] } });
out.schema = [schema.uri, (await client.schemas.list()).schemas.length, (await client.schemas.get(schema.uri)).version];
await client.schemas.delete(schema.uri);
out.schemasAfter = (await client.schemas.list()).schemas.length;
const dead = await client.enqueue('js.dead', [], { queue: 'js-dlq', retry: { maxAttempts: 1, onExhaustion: 'dead_letter' } });
const worker = new OJSWorker({ url, queues: ['js-dlq'], pollInterval: 100, handleSignals: false });
worker.register('js.dead', async () => { throw new Error('boom'); });
await worker.start();
await until(async () => (await client.queues.listDeadLetter()).some((j) => j.id === dead.id), 'the dead letter');
await worker.stop();
await client.queues.retryDeadLetter(dead.id);
out.retried = await stateOf(dead.id);
""", "client")
    assert seen["job"] == ["available", "js-client", True] and seen["cancelled"] == "cancelled"
    assert seen["batch"] == 3 and {"default", "js-client"} <= set(seen["queues"])
    assert (seen["stats"], seen["paused"], seen["resumed"]) == (3, True, False)
    assert seen["unique"] == "OJSDuplicateError" and seen["later"] == "scheduled"
    assert seen["cron"] == ["js-nightly", "0 3 * * *", "js.report"] and seen["crons"] == ["js-nightly"]
    assert seen["cronsAfter"] == 0
    # The JS SDK takes a `schema` enqueue option but never sends it, so no job of its names a schema.
    assert seen["schema"] == ["urn:example:js.mail:1", 1, "1.0.0"] and seen["schemasAfter"] == 0
    assert seen["retried"] == "available"


def test_worker_types_priorities_retries_non_retryable_progress_and_workflows(url):
    seen = scenario(url, """
const order = [], tries = {};
const transport = new HttpTransport({ url });
const worker = new OJSWorker({ url, queues: ['js-work'], concurrency: 1, pollInterval: 100, heartbeatInterval: 500, handleSignals: false });
worker.register('js.add', async (ctx) => {
  order.push(ctx.job.args[0]);
  await reportProgress(transport, ctx.job.id, 40, 'some');
  return { sum: ctx.job.args[0] + ctx.job.args[1] };
});
worker.register('js.flaky', async (ctx) => { tries[ctx.job.id] = (tries[ctx.job.id] ?? 0) + 1; if (tries[ctx.job.id] === 1) throw new Error('first'); return 'ok'; });
class BadInput extends Error { constructor(m) { super(m); this.name = 'BadInput'; } }
worker.register('js.bad', async (ctx) => { tries[ctx.job.id] = (tries[ctx.job.id] ?? 0) + 1; throw new BadInput('never again'); });
worker.register('js.step', async (ctx) => ctx.job.args[0]);
const retry = { maxAttempts: 3, initialInterval: 'PT0.2S', jitter: false, nonRetryableErrors: ['BadInput'] };
const low = await client.enqueue('js.add', [1, 1], { queue: 'js-work', priority: 1 });
const high = await client.enqueue('js.add', [2, 2], { queue: 'js-work', priority: 9 });
const flaky = await client.enqueue('js.flaky', [], { queue: 'js-work', retry });
const bad = await client.enqueue('js.bad', [], { queue: 'js-work', retry });
const step = (a) => ({ type: 'js.step', args: [a], options: { queue: 'js-work' } });
const flows = [await client.workflow(chain(step(1), step(2))), await client.workflow(group(step(1), step(2))),
               await client.workflow(batch([step(1)], { on_complete: step('done') }))];
await worker.start();
for (const j of [low, high, flaky]) await until(async () => (await stateOf(j.id)) === 'completed', j.type);
await until(async () => (await stateOf(bad.id)) === 'discarded', 'the BadInput job discarded');
for (const wf of flows) await until(async () => (await client.getWorkflow(wf.id)).state === 'completed', wf.type);
await worker.stop();
out.order = order;
out.result = (await client.getJob(high.id)).result;
out.tries = [tries[flaky.id], tries[bad.id]];
out.error = (await client.getJob(bad.id)).error;
out.progress = await (await fetch(`${url}/ojs/v1/jobs/${high.id}/progress`)).json();
out.flows = flows.map((w) => [w.type, typeof w.id]);
const idle = await client.workflow(chain({ type: 'js.step', args: [1], options: { queue: 'js-nobody' } }, step(2)));
await client.cancelWorkflow(idle.id);
out.cancelledFlow = (await client.getWorkflow(idle.id)).state;
""", "worker")
    assert seen["order"] == [2, 1] and seen["result"] == {"sum": 4} and seen["tries"] == [2, 1]
    assert seen["error"]["type"] == "BadInput"
    assert (seen["progress"]["percentage"], seen["progress"]["message"]) == (40, "some")
    assert seen["flows"] == [["chain", "string"], ["group", "string"], ["batch", "string"]]
    assert seen["cancelledFlow"] == "cancelled"


def test_a_long_job_with_a_short_visibility_timeout_runs_once_and_a_cancelled_one_stops(url):
    seen = scenario(url, """
const runs = [];
const make = (name) => {
  const w = new OJSWorker({ url, queues: ['js-long'], pollInterval: 100, heartbeatInterval: 500, visibilityTimeout: 4000, handleSignals: false });
  w.register('js.long', async () => { runs.push(name); await sleep(12000); return name; });
  return w;
};
const first = make('first'), second = make('second');
const job = await client.enqueue('js.long', [], { queue: 'js-long' });
await first.start();
await until(async () => (await stateOf(job.id)) === 'active', 'the job claimed');
await second.start();
await until(async () => (await stateOf(job.id)) === 'completed', 'the long job completed', 120000);
await first.stop(); await second.stop();
out.runs = runs;
out.attempt = (await client.getJob(job.id)).attempt;

const events = [];
const worker = new OJSWorker({ url, queues: ['js-cancel'], pollInterval: 100, heartbeatInterval: 500, shutdownTimeout: 2000, handleSignals: false });
worker.register('js.forever', (ctx) => new Promise((resolve, reject) => {
  events.push('started');
  ctx.signal.addEventListener('abort', () => { events.push('aborted'); reject(new Error('aborted')); });
}));
const forever = await client.enqueue('js.forever', [], { queue: 'js-cancel' });
await worker.start();
await until(async () => (await stateOf(forever.id)) === 'active', 'the job running');
await client.cancelJob(forever.id);
await until(async () => worker.currentState === 'terminated', 'the worker stopped', 120000);
out.events = events;
out.cancelled = await stateOf(forever.id);
""", "long")
    assert seen["runs"] == ["first"] and seen["attempt"] == 1
    assert seen["events"] == ["started", "aborted"] and seen["cancelled"] == "cancelled"
