//! The tools `pycell mcp` offers: their descriptions (written for the LLM
//! that reads them), their input and output schemas, and the checking of
//! their arguments into a [`RunRequest`].

use pycell_protocol::info::ToolsInfo;
use std::sync::Arc;

use rmcp::handler::server::common::{schema_for_empty_input, schema_for_input, schema_for_output};
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::Deserialize;

use pycell_policy::Policy;
use pycell_protocol::messages::{encode_b64, InputFile, RunRequest};

use super::output::{human_bytes, RunPythonOutput};
use pycell_protocol::info::HostInfo;

pub const RUN_PYTHON: &str = "run_python";
pub const SANDBOX_INFO: &str = "sandbox_info";

/// Largest `code` (and largest `stdin`) a call may carry. Well under the
/// stdio transport's 16 MiB message limit, so that an oversized argument
/// gets this explanation rather than a dropped message.
pub const MAX_CODE_BYTES: usize = 4 << 20;

/// Arguments of `run_python`. The optional ones are described as plain
/// types, not nullable ones: leave an argument out rather than pass null
/// (null is accepted too). Single-type schemas are the most portable across
/// the function-calling dialects of model providers.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunPythonArgs {
    /// Python 3 source code, run as the main module (`__main__`). Print what you want to see.
    pub code: String,
    /// Wall-clock limit in seconds (fractions allowed), more than 0 and at most the policy's ceiling (sandbox_info shows it). Default: the policy's.
    #[serde(default)]
    #[schemars(with = "f64", transform = no_default, extend("exclusiveMinimum" = 0, "maximum" = 86400))]
    pub timeout_s: Option<f64>,
    /// Policy to run under (see sandbox_info). Default: the server's default policy.
    #[serde(default)]
    #[schemars(with = "String", transform = no_default)]
    pub policy: Option<String>,
    /// Text given to the program on standard input. Default: empty.
    #[serde(default)]
    #[schemars(with = "String", transform = no_default)]
    pub stdin: Option<String>,
    /// Packages to install for this call, as pip requirement strings, e.g. ["pandas>=2.2", "requests"]. Installed from the package index as wheels only, into a cached environment (the first call with a given list takes seconds, later ones milliseconds). A PEP 723 `# /// script` block in `code` works too. Default: none.
    #[serde(default)]
    #[schemars(with = "Vec<String>", transform = no_default)]
    pub dependencies: Option<Vec<String>>,
    /// Files to put into /workspace before the code runs, e.g. [{"path": "data.csv", "content": "x,y\n1,2\n"}]: each a plain file name (no '/') with `content` (text) or `content_base64` (bytes); the code reads them by name. At most 64 files, 4 MiB together. Default: none.
    #[serde(default)]
    #[schemars(with = "Vec<InputFileArg>", transform = no_default)]
    pub files: Option<Vec<InputFileArg>>,
    /// A session's handle (from session_start): the code runs as that session's next cell, with its variables, imports and files; the value of a last expression is returned. policy, stdin and dependencies do not apply (the session has its own). Default: a fresh one-shot sandbox.
    #[serde(default)]
    #[schemars(with = "String", transform = no_default)]
    pub session: Option<String>,
}

/// One input file of `run_python`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputFileArg {
    /// A plain file name in /workspace, e.g. "data.csv".
    pub path: String,
    /// The file's text. Give this or content_base64.
    #[serde(default)]
    #[schemars(with = "String", transform = no_default)]
    pub content: Option<String>,
    /// The file's bytes in base64. Give this or content.
    #[serde(default)]
    #[schemars(with = "String", transform = no_default)]
    pub content_base64: Option<String>,
}

/// An absent optional argument means "the policy's (or server's) default",
/// which no JSON value spells; `"default": null` would contradict the type.
pub(super) fn no_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

/// A tool call's arguments are wrong; the message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgumentError(pub String);

const RUN_PYTHON_EXAMPLE: &str = r#"{"code": "import math\nprint(math.factorial(20))"}"#;

/// A `run_python` call: a one-shot run's request, or a session's cell.
#[derive(Debug)]
pub enum RunPythonCall {
    Run(Box<RunRequest>),
    Cell {
        session: String,
        code: String,
        timeout: Option<std::time::Duration>,
    },
}

/// Parse `run_python`'s arguments: a cell when they name a session.
pub fn run_python_call(
    args: Option<JsonObject>,
    default_policy: &str,
) -> Result<RunPythonCall, ArgumentError> {
    let mut a = parse_run_python(args)?;
    let Some(session) = a.session.take() else {
        return request_from(a, default_policy).map(|r| RunPythonCall::Run(Box::new(r)));
    };
    let given = [
        ("policy", a.policy.is_some()),
        ("stdin", a.stdin.is_some()),
        ("dependencies", a.dependencies.is_some()),
        ("files", a.files.is_some()),
    ];
    if let Some((field, _)) = given.iter().find(|(_, given)| *given) {
        return Err(ArgumentError(format!(
            "`{field}` does not apply to a session's cell: the session has its own (fixed by session_start); leave it out"
        )));
    }
    Ok(RunPythonCall::Cell {
        session,
        code: a.code,
        timeout: a.timeout_s.map(std::time::Duration::from_secs_f64),
    })
}

/// Parse `run_python`'s arguments into the request the sandboxes run.
#[cfg(test)]
pub fn run_python_request(
    args: Option<JsonObject>,
    default_policy: &str,
) -> Result<RunRequest, ArgumentError> {
    parse_run_python(args).and_then(|a| request_from(a, default_policy))
}

/// `run_python`'s arguments, each checked.
fn parse_run_python(args: Option<JsonObject>) -> Result<RunPythonArgs, ArgumentError> {
    let value = serde_json::Value::Object(args.unwrap_or_default());
    let a: RunPythonArgs = serde_json::from_value(value).map_err(|e| {
        let msg = e.to_string();
        ArgumentError(if msg.starts_with("missing field `code`") {
            format!(
                "missing required argument `code`: the Python source to run, e.g. {RUN_PYTHON_EXAMPLE}"
            )
        } else if msg.starts_with("unknown field") {
            format!("{msg}; run_python takes code (required), timeout_s, policy, stdin, dependencies, files and session")
        } else {
            format!(
                "invalid arguments: {msg}; expected code (string, required), timeout_s (number of seconds), policy (string), stdin (string), session (string), e.g. {RUN_PYTHON_EXAMPLE}"
            )
        })
    })?;
    if a.code.len() > MAX_CODE_BYTES {
        return Err(ArgumentError(format!(
            "`code` is {} bytes, more than the {} allowed; generate large data inside the program instead of sending it",
            a.code.len(),
            human_bytes(MAX_CODE_BYTES as u64)
        )));
    }
    if let Some(s) = &a.stdin {
        if s.len() > MAX_CODE_BYTES {
            return Err(ArgumentError(format!(
                "`stdin` is {} bytes, more than the {} allowed",
                s.len(),
                human_bytes(MAX_CODE_BYTES as u64)
            )));
        }
    }
    if let Some(t) = a.timeout_s {
        pycell_policy::timeout_from_secs(t, pycell_policy::MAX_WALL_TIMEOUT).map_err(|p| {
            ArgumentError(format!(
                "`timeout_s` {p}; leave it out to use the policy's limit"
            ))
        })?;
    }
    Ok(a)
}

fn request_from(a: RunPythonArgs, default_policy: &str) -> Result<RunRequest, ArgumentError> {
    let files = input_files(a.files.unwrap_or_default())?;
    let mut req = RunRequest {
        code: a.code,
        policy: Some(a.policy.unwrap_or_else(|| default_policy.to_string())),
        dependencies: a.dependencies.unwrap_or_default(),
        files,
        ..Default::default()
    };
    req.limits.timeout_s = a.timeout_s;
    if let Some(s) = a.stdin {
        req.set_stdin(s.as_bytes());
    }
    Ok(req)
}

/// `files` as the request carries them: each with one of its contents,
/// all of them within [`MAX_CODE_BYTES`].
fn input_files(files: Vec<InputFileArg>) -> Result<Vec<InputFile>, ArgumentError> {
    let mut total = 0usize;
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let data_base64 = match (f.content, f.content_base64) {
            (Some(t), None) => encode_b64(t.as_bytes()),
            (None, Some(b)) => b,
            _ => {
                return Err(ArgumentError(format!(
                "files: {:?}: give exactly one of `content` (text) and `content_base64` (bytes)",
                f.path
            )))
            }
        };
        total += data_base64.len() / 4 * 3;
        if total > MAX_CODE_BYTES {
            return Err(ArgumentError(format!(
                "files: more than the {} allowed together; make large data inside the program",
                human_bytes(MAX_CODE_BYTES as u64)
            )));
        }
        out.push(InputFile {
            name: f.path,
            data_base64,
        });
    }
    Ok(out)
}

fn secs(s: f64) -> String {
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s} s")
    }
}

/// `run_python`'s description, with the default policy's real limits.
fn run_python_description(
    default_policy: &str,
    policy: Option<&Policy>,
    code_mode: Option<&ToolsInfo>,
) -> String {
    let limits_text = match policy.map(|p| (&p.limits, &p.ceilings)) {
        Some((l, c)) => format!(
            "Limits when no policy is given (policy {default_policy}): {} wall-clock (change it with timeout_s, up to {}), {} of CPU time, {} of memory, {} processes/threads, {} each of stdout and stderr (the rest is dropped and stdout_truncated/stderr_truncated say so), {} of disk for /workspace, /tmp and /dev/shm together.",
            secs(l.wall_timeout.as_secs_f64()),
            secs(c.wall_timeout.as_secs_f64()),
            secs(l.cpu_time.as_secs_f64()),
            human_bytes(l.memory.get()),
            l.pids,
            human_bytes(l.max_output.get()),
            human_bytes(l.disk.get()),
        ),
        None => format!("Limits are those of the policy ({default_policy}); see sandbox_info."),
    };
    format!(
        r#"Run Python 3 code in a fresh, isolated Linux sandbox and return what it printed.

Without `session`, every call starts a new, empty sandbox: nothing (variables, files, installed packages) carries over between calls, so put everything a task needs into one `code` string. The code runs as __main__ from /workspace/main.py with /workspace as its working directory. It has the standard library and the packages of the policy's interpreter, no network unless its policy grants some (the default policy has none, not even DNS), and it cannot see or change the host. You get its stdout and stderr, not the value of the last expression: print what you want to see. matplotlib figures it leaves open (no plt.show() needed; the data-science policy has matplotlib) and PNG/JPEG files it writes come back as images, scaled down, with their full-size paths in the result's `images`; pass files in with `files`.

With `session` (a handle from session_start), the code runs as the next cell of that session, as in a Jupyter notebook: variables, imports and /workspace files of earlier cells are there, the repr of a last expression comes back (cell.value), an exception comes back with its traceback (cell.exception, status "error"), and matplotlib figures left open come back as images (their files are under /workspace/figures). A cell over timeout_s gets KeyboardInterrupt and the session goes on; a cell that ignores it kills the session (error code session_killed).

Network: under a policy whose network is "allowlist" (sandbox_info lists each policy's network_allow), the sandbox reaches the allowed hosts over HTTP(S) through pycell's proxy, which HTTP_PROXY/HTTPS_PROXY point at: urllib, requests, httpx, pip and uv use it as they are (aiohttp needs trust_env=True). There is no DNS and no direct connection in the sandbox, so other libraries and raw sockets cannot get out. A host that is not allowed gets HTTP 403 whose status line says why and what is allowed (urllib: "Tunnel connection failed: 403 pycell egress proxy: CONNECT host:443 denied ..."); the result's `network` lists the hosts reached and the requests denied.

Packages: pass `dependencies` (pip requirement strings, e.g. ["pandas>=2.2", "requests"]) or put a PEP 723 `# /// script` block with `dependencies = [...]` at the top of `code`. They are installed from the package index as wheels only (a package without a wheel for this platform is refused as deps_no_wheel) into an environment that is cached: the first call with a given list takes seconds (progress notifications say what is being installed), later calls reuse it in milliseconds. The result's `env` lists every installed package with its version. Installed packages are read-only in the sandbox.

{limits_text} Call sandbox_info for the other policies and their limits.
{tools_text}

The result has `status`: "ok" (exit code 0), "error" (non-zero exit, e.g. an uncaught exception: the traceback is in stderr), "timeout", "oom" (memory limit reached), "killed" (cancelled, or the CPU-time limit) or "refused" (the sandbox could not be built, `error` says why). All of these are normal results to read, not tool failures; only "refused" sets isError. Arguments that cannot be run as given (unknown policy, timeout_s out of range, code over {max_code}) return an error saying what to fix.

Example: {{"code": "import statistics\nprint(statistics.mean([3, 5, 10]))", "timeout_s": 10}} returns status "ok" and stdout "6\n"."#,
        max_code = human_bytes(MAX_CODE_BYTES as u64),
        tools_text = code_mode.map(tools_paragraph).unwrap_or_default(),
    )
}

/// Most tool signatures `run_python`'s description lists (sandbox_info
/// lists them all).
const DESCRIBED_TOOLS: usize = 40;

/// What `run_python`'s description says of code mode.
fn tools_paragraph(info: &ToolsInfo) -> String {
    let mut t = String::from("\nTools: the code can call MCP tools that run outside the sandbox, with credentials it never sees: `import pycell_tools`, then `pycell_tools.<server>.<tool>(**arguments)` (or `await pycell_tools.aio.<server>.<tool>(...)`, from threads and asyncio tasks at once); `pycell_tools.list_servers()` and `help(pycell_tools.<server>.<tool>)` describe them. A result is the tool's structured content (a dict or list) when it has one, else its text. A refused or failed call raises `pycell_tools.ToolError`, whose `.code` says why (denied, unknown, bad_arguments, tool_failed, upstream_failed, limit); calls are counted in the result's `tool_calls`. One program that calls many tools and prints only what matters saves a round trip through you per call. Example: {\"code\": \"import pycell_tools\\nprint(pycell_tools.time.get_current_time(timezone='UTC'))\"}.\n");
    match info.callable.is_empty() {
        true => t.push_str("No tool is callable now (sandbox_info says why).\n"),
        false => {
            t.push_str("Callable tools:\n");
            for line in info.callable.iter().take(DESCRIBED_TOOLS) {
                t.push_str(&format!("  {line}\n"));
            }
            if info.callable.len() > DESCRIBED_TOOLS {
                let more = info.callable.len() - DESCRIBED_TOOLS;
                t.push_str(&format!("  ... and {more} more: see sandbox_info.\n"));
            }
        }
    }
    t
}

const SANDBOX_INFO_DESCRIPTION: &str = r#"Describe the sandbox that run_python uses: the policies you can pass as its `policy` argument (name, description, purpose: only "code" policies run code, network mode with the hosts an "allowlist" policy lets code reach (network_allow, network_deny), and limits: wall-clock and CPU time, memory, processes, output caps, disk size) and the isolation layers this host enforces (user namespaces, Landlock, seccomp, cgroups, the time namespace, memfd sealing, socket-buffer accounting, how runs are killed, root), measured when called. Takes no arguments. Use it to choose a policy or a timeout_s, or to understand a "refused" result. Example: {} returns {"version": "...", "mode": "embedded", "policies": [{"name": "default", "network": "none", "limits": {"wall_timeout_s": 30.0, "memory_bytes": 536870912, ...}, ...}], "layers": [{"layer": "landlock", "available": true, "detail": "ABI 7"}, ...]}."#;

/// Keywords that constrain one JSON type, moved with it into its own branch.
const TYPE_KEYWORDS: &[&str] = &[
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "enum",
    "items",
];

/// `{"type": ["integer", "null"], ...}` becomes
/// `{"anyOf": [{"type": "integer", ...}, {"type": "null"}]}`: the same
/// contract, in the form clients that map schemas onto a single-type dialect
/// understand (the MCP inspector's portability check asks for it).
fn split_nullable_types(v: &mut serde_json::Value) {
    use serde_json::{json, Value};
    match v {
        Value::Object(m) => {
            for child in m.values_mut() {
                split_nullable_types(child);
            }
            let other = match m.get("type") {
                Some(Value::Array(types)) if types.len() == 2 && types.contains(&json!("null")) => {
                    types.iter().find(|t| *t != "null").cloned()
                }
                _ => None,
            };
            if let Some(other) = other {
                m.remove("type");
                let mut branch = JsonObject::new();
                branch.insert("type".into(), other);
                for k in TYPE_KEYWORDS {
                    if let Some(x) = m.remove(*k) {
                        branch.insert((*k).into(), x);
                    }
                }
                m.insert(
                    "anyOf".into(),
                    json!([Value::Object(branch), {"type": "null"}]),
                );
            }
        }
        Value::Array(items) => items.iter_mut().for_each(split_nullable_types),
        _ => {}
    }
}

/// schemars names Rust's number types in `format` (`uint64`, `double`,
/// ...). JSON Schema defines no such formats; validators such as ajv warn
/// about each. The range is already stated by `minimum`.
fn drop_rust_number_formats(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let rust_format = m.get("format").and_then(Value::as_str).is_some_and(|f| {
                matches!(f, "float" | "double")
                    || f.strip_prefix("uint")
                        .or_else(|| f.strip_prefix("int"))
                        .is_some_and(|bits| bits.chars().all(|c| c.is_ascii_digit()))
            });
            if rust_format {
                m.remove("format");
            }
            m.values_mut().for_each(drop_rust_number_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_rust_number_formats),
        _ => {}
    }
}

/// A generated schema in its most portable spelling (see the two passes above).
pub(super) fn portable(schema: Arc<JsonObject>) -> Arc<JsonObject> {
    let mut v = serde_json::Value::Object(schema.as_ref().clone());
    split_nullable_types(&mut v);
    drop_rust_number_formats(&mut v);
    match v {
        serde_json::Value::Object(m) => Arc::new(m),
        _ => schema,
    }
}

/// The tool list, built once at startup.
pub fn tools(
    default_policy: &str,
    default: Option<&Policy>,
    code_mode: Option<&ToolsInfo>,
) -> Vec<Tool> {
    let input = portable(
        schema_for_input::<RunPythonArgs>()
            .expect("RunPythonArgs is a struct, so its schema is an object"),
    );
    let run = Tool::new(
        RUN_PYTHON,
        run_python_description(default_policy, default, code_mode),
        input,
    )
    .with_title("Run Python in a sandbox")
    .with_raw_output_schema(portable(schema_for_output::<RunPythonOutput>()))
    .with_annotations(
        ToolAnnotations::with_title("Run Python in a sandbox")
            .read_only(false)
            // Each run is a throwaway sandbox: nothing outside it changes.
            .destructive(false)
            .idempotent(false)
            .open_world(false),
    );
    let info = Tool::new(
        SANDBOX_INFO,
        SANDBOX_INFO_DESCRIPTION,
        schema_for_empty_input(),
    )
    .with_title("Sandbox policies and isolation status")
    .with_raw_output_schema(portable(schema_for_output::<HostInfo>()))
    .with_annotations(
        ToolAnnotations::with_title("Sandbox policies and isolation status")
            .read_only(true)
            .idempotent(true)
            .open_world(false),
    );
    vec![run, info]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: serde_json::Value) -> Option<JsonObject> {
        match v {
            serde_json::Value::Object(m) => Some(m),
            _ => None,
        }
    }

    #[test]
    fn good_arguments_become_a_request() {
        let r = run_python_request(
            args(json!({"code": "print(1)", "timeout_s": 2.5, "stdin": "hi"})),
            "default",
        )
        .unwrap();
        assert_eq!(r.code, "print(1)");
        assert_eq!(r.policy.as_deref(), Some("default"));
        assert_eq!(r.limits.timeout_s, Some(2.5));
        assert_eq!(r.stdin_bytes().unwrap(), b"hi");
    }

    #[test]
    fn bad_arguments_say_what_to_fix() {
        let e = run_python_request(args(json!({})), "default").unwrap_err();
        assert!(e.0.starts_with("missing required argument `code`"), "{e:?}");
        let e = run_python_request(None, "default").unwrap_err();
        assert!(e.0.starts_with("missing required argument `code`"), "{e:?}");
        let e =
            run_python_request(args(json!({"code": "", "timeout_s": -1})), "default").unwrap_err();
        assert!(e.0.starts_with("`timeout_s` must be more than 0"), "{e:?}");
        let e = run_python_request(args(json!({"code": "", "timeout": 3})), "default").unwrap_err();
        assert!(e.0.contains("unknown field `timeout`"), "{e:?}");
        assert!(e.0.contains("timeout_s"), "{e:?}");
        let e = run_python_request(args(json!({"code": 5})), "default").unwrap_err();
        assert!(e.0.starts_with("invalid arguments: invalid type"), "{e:?}");
        let big = "#".repeat(MAX_CODE_BYTES + 1);
        let e = run_python_request(args(json!({ "code": big })), "default").unwrap_err();
        assert!(e.0.starts_with("`code` is "), "{e:?}");
    }

    #[test]
    fn schemas_are_objects_and_describe_every_field() {
        let policy = pycell_policy::builtin::load("default").unwrap();
        let t = tools("default", Some(&policy), None);
        let run = &t[0];
        assert_eq!(run.input_schema["type"], "object");
        assert_eq!(run.input_schema["required"], json!(["code"]));
        for f in ["code", "timeout_s", "policy", "stdin"] {
            let p = &run.input_schema["properties"][f];
            assert!(p["description"].is_string(), "{f}");
            assert!(p["type"].is_string(), "{f}: one type, not a list: {p}");
            assert!(p.get("default").is_none(), "{f}: {p}");
        }
        let out = run.output_schema.as_ref().unwrap();
        assert_eq!(out["type"], "object");
        for f in [
            "status",
            "exit_code",
            "stdout",
            "stderr",
            "duration_ms",
            "layers",
        ] {
            assert!(out["properties"].get(f).is_some(), "{f}");
        }
        assert_eq!(
            out["properties"]["exit_code"]["anyOf"],
            json!([{"type": "integer"}, {"type": "null"}])
        );
        let text = serde_json::to_string(out.as_ref()).unwrap();
        assert!(!text.contains(r#""type":["#), "{text}");
        assert!(!text.contains(r#""format""#), "{text}");
        let desc = run.description.as_deref().unwrap();
        assert!(desc.contains("30 s wall-clock"), "{desc}");
        assert!(
            desc.contains("change it with timeout_s, up to 600 s"),
            "{desc}"
        );
        assert!(desc.contains("512 MiB of memory"), "{desc}");
        assert!(!desc.contains("pycell_tools"), "no tools offered: {desc}");
    }

    #[test]
    fn with_tools_the_description_says_how_to_call_them_and_lists_them() {
        let info = ToolsInfo {
            callable: (0..45)
                .map(|i| format!("pycell_tools.s.t{i}(*, x: str)"))
                .collect(),
            unavailable: Vec::new(),
        };
        let t = tools("default", None, Some(&info));
        let desc = t[0].description.as_deref().unwrap();
        assert!(desc.contains("import pycell_tools"), "{desc}");
        assert!(desc.contains("ToolError"), "{desc}");
        assert!(desc.contains("  pycell_tools.s.t39(*, x: str)\n"), "{desc}");
        assert!(!desc.contains("t40("), "{desc}");
        assert!(desc.contains("and 5 more: see sandbox_info"), "{desc}");
        let none = ToolsInfo::default();
        let t = tools("default", None, Some(&none));
        let desc = t[0].description.as_deref().unwrap();
        assert!(desc.contains("No tool is callable now"), "{desc}");
    }
}
