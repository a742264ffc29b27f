// The published E2B code interpreter SDK for JavaScript
// (@e2b/code-interpreter, pinned in package.json), unchanged, against
// pycell's E2B endpoint, configured only by E2B_API_URL and
// E2B_SANDBOX_URL and a pycell token as the API key.
//
//   node sdk_e2b.mjs URL TOKENS_JSON
//
// Prints one JSON report: each step's observations, or the error it met.
// tests/tests/e2b.rs judges it.

import { Sandbox } from '@e2b/code-interpreter'

const [url, tokensJson] = process.argv.slice(2)
process.env.E2B_API_URL = `${url}/e2b`
process.env.E2B_SANDBOX_URL = `${url}/e2b`
delete process.env.E2B_API_KEY
const tokens = JSON.parse(tokensJson)
const report = {}

async function step(name, fn) {
  try {
    report[name] = await fn()
  } catch (e) {
    report[name] = { exception: e?.name ?? String(e), message: String(e?.message ?? e).slice(0, 2000) }
  }
}

let sbx
await step('create', async () => {
  sbx = await Sandbox.create('data-science', { apiKey: tokens.alice, timeoutMs: 240_000 })
  return { id: sbx.sandboxId }
})

if (sbx) {
  await step('state', async () => {
    await sbx.runCode('x = 41')
    const e = await sbx.runCode('x + 1')
    return { text: e.text, count: e.executionCount }
  })
  await step('stream', async () => {
    const seen = []
    const code = "import sys, time\nprint('one', flush=True)\ntime.sleep(0.2)\nprint('two', file=sys.stderr, flush=True)\ntime.sleep(0.2)\nprint('three', flush=True)\n"
    await sbx.runCode(code, {
      onStdout: (m) => seen.push(['stdout', m.line]),
      onStderr: (m) => seen.push(['stderr', m.line]),
    })
    return { seen }
  })
  await step('dataframe', async () => {
    const e = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [4.5, 5.5]})")
    const main = e.results.filter((r) => r.isMainResult)
    return { main: main.length, markdown: main[0]?.markdown ?? null }
  })
  await step('plot', async () => {
    const e = await sbx.runCode("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\n")
    const png = e.results.find((r) => r.png)?.png ?? ''
    return { png_magic: Buffer.from(png, 'base64').subarray(0, 4).toString('latin1') === '\x89PNG' }
  })
  await step('error', async () => {
    const e = await sbx.runCode('1 / 0')
    return { name: e.error?.name, value: e.error?.value, traceback: e.error?.traceback }
  })
  await step('files', async () => {
    await sbx.files.write('/home/user/js/note.txt', 'from node')
    const listed = await sbx.files.list('/home/user/js')
    return {
      read: await sbx.files.read('/home/user/js/note.txt'),
      listed: listed.map((e) => [e.name, e.type]),
      exists: await sbx.files.exists('/home/user/js/note.txt'),
      made: await sbx.files.makeDir('/home/user/js/sub'),
    }
  })
  await step('command', async () => {
    const r = await sbx.commands.run('ls /workspace/js')
    let failed
    try {
      await sbx.commands.run('exit 4')
      failed = 'no error'
    } catch (e) {
      failed = { name: e.name, exitCode: e.exitCode }
    }
    return { stdout: r.stdout, exitCode: r.exitCode, failed }
  })
  await step('stranger', async () => {
    const killed = await Sandbox.kill(sbx.sandboxId, { apiKey: tokens.bob })
    const theirs = (await Sandbox.list({ apiKey: tokens.bob }).nextItems()).map((s) => s.sandboxId)
    return { killed, listed: theirs.includes(sbx.sandboxId), alive: (await sbx.runCode('x')).text }
  })
  await step('wrong_key', async () => {
    try {
      await Sandbox.create({ apiKey: 'pycell_not_a_token' })
      return { created: true }
    } catch (e) {
      return { name: e.name }
    }
  })
  await step('kill', async () => {
    const killed = await sbx.kill()
    const mine = (await Sandbox.list({ apiKey: tokens.alice }).nextItems()).map((s) => s.sandboxId)
    return { killed, listed: mine.includes(sbx.sandboxId) }
  })
}
process.stdout.write(JSON.stringify(report) + '\n')
