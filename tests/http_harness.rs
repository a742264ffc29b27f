//! Starting `pycell mcp --http` and `pycell gateway` for tests, and the
//! credentials they take: tokens by `pycell mcp-token`, keys and
//! certificates by tests/mcp/sdk_http.py. Each process starts as root and
//! becomes an unused uid; each is killed when its handle drops.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::sdk::tools_python;
use crate::{pycell_bin, repo_root};

/// The front end's uid, and the gateways': no user has them.
pub const FRONT_UID: u32 = 64_981;
pub const GATEWAY_UID: u32 = 64_982;
/// The test issuer of OAuth access tokens.
pub const ISSUER: &str = "https://issuer.example.net";

/// A running pycell server process, killed on drop.
#[derive(Debug)]
pub struct Served {
    pub child: Child,
    /// What it said it serves: the front end's URL, the gateway's address.
    pub at: String,
    /// The rest of its stderr.
    pub log: std::path::PathBuf,
}

impl Served {
    /// What it said on stderr after it started serving.
    pub fn said(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Start `pycell ARGS`, reading what it serves from the first line of its
/// stderr (the word after `marker`).
fn serve(args: &[String], marker: &str) -> Served {
    serve_program(&pycell_bin().to_string_lossy(), args, marker)
}

fn serve_program(program: &str, args: &[String], marker: &str) -> Served {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pycell starts");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let at = line
        .split(marker)
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("pycell {args:?} did not say {marker:?}: {line:?}"))
        .to_string();
    // The rest of its stderr, to a file (the pipe must not fill).
    let log = std::env::temp_dir().join(format!("pycell-served-{}.log", child.id()));
    let mut file = std::fs::File::create(&log).unwrap();
    std::thread::spawn(move || std::io::copy(&mut err, &mut file));
    Served { child, at, log }
}

/// `pycell mcp --http 127.0.0.1:0 --user FRONT_UID ARGS`; `at` is its URL.
pub fn start_front(args: &[&str]) -> Served {
    serve(&front_args(args), "serving MCP at ")
}

fn front_args(args: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = ["mcp", "--http", "127.0.0.1:0", "--user"]
        .map(String::from)
        .to_vec();
    all.push(FRONT_UID.to_string());
    all.extend(args.iter().map(|s| s.to_string()));
    all
}

/// [`start_front`] in a mount namespace of its own whose /etc/hosts is
/// `hosts` (bound over it: names the test controls, changed in place).
pub fn start_front_with_hosts(hosts: &Path, args: &[&str]) -> Served {
    let script = "mount --bind \"$0\" /etc/hosts && exec \"$@\"";
    let mut all: Vec<String> = ["--mount", "--propagation", "private", "sh", "-c", script]
        .map(String::from)
        .to_vec();
    all.push(hosts.to_string_lossy().to_string());
    all.push(pycell_bin().to_string_lossy().to_string());
    all.extend(front_args(args));
    serve_program("unshare", &all, "serving MCP at ")
}

/// `pycell gateway` on a loopback port for the pycelld at `socket`, with
/// the certificates in `dir` (see [`credentials`]); `at` is HOST:PORT.
pub fn start_gateway(socket: &Path, dir: &Path) -> Served {
    start_gateway_at(socket, dir, "127.0.0.1:0")
}

/// [`start_gateway`], listening on `listen`.
pub fn start_gateway_at(socket: &Path, dir: &Path, listen: &str) -> Served {
    let p = |f: &str| dir.join(f).to_string_lossy().to_string();
    let args = [
        "gateway".to_string(),
        "--listen".into(),
        listen.into(),
        "--socket".into(),
        socket.to_string_lossy().to_string(),
        "--tls-cert".into(),
        p("gateway-cert.pem"),
        "--tls-key".into(),
        p("gateway-key.pem"),
        "--client-ca".into(),
        p("ca.pem"),
        "--user".into(),
        GATEWAY_UID.to_string(),
    ];
    serve(&args, "connections on ")
}

/// `pycell mcp-token NAME [--scope S]...`: (token, [[token]] entry).
pub fn make_token(name: &str, scopes: &[&str]) -> (String, String) {
    let mut cmd = Command::new(pycell_bin());
    cmd.args(["mcp-token", name]);
    for s in scopes {
        cmd.args(["--scope", s]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    let token = err.lines().last().unwrap().trim().to_string();
    (token, String::from_utf8(out.stdout).unwrap())
}

/// Tokens for alice, bob (run), viewer (tools only) and limited (one run
/// at once, three a minute) in DIR/tokens.toml; the issuer's keys, a TLS
/// certificate, the cluster CA and its certificates (sdk_http.py keys), and
/// DIR/oauth.toml. The tokens by name.
pub fn credentials(dir: &Path) -> serde_json::Map<String, Value> {
    let mut file = String::new();
    let mut tokens = serde_json::Map::new();
    for (name, scopes) in [
        ("alice", vec![]),
        ("bob", vec![]),
        ("viewer", vec!["pycell:tools"]),
        ("limited", vec![]),
    ] {
        let (token, entry) = make_token(name, &scopes);
        file.push_str(&entry);
        if name == "limited" {
            file.push_str("max_concurrent_runs = 1\nruns_per_minute = 3\n");
        }
        tokens.insert(name.into(), Value::String(token));
    }
    std::fs::write(dir.join("tokens.toml"), file).unwrap();
    let keys = Command::new(tools_python())
        .arg(repo_root().join("tests/mcp/sdk_http.py"))
        .arg("keys")
        .arg(dir)
        .output()
        .unwrap();
    assert!(keys.status.success(), "{keys:?}");
    std::fs::write(
        dir.join("oauth.toml"),
        format!(
            "issuer = \"{ISSUER}\"\njwks = \"{}\"\n",
            dir.join("jwks.json").display()
        ),
    )
    .unwrap();
    tokens
}

/// The value at `pointer`, or null.
pub fn get<'a>(v: &'a Value, pointer: &str) -> &'a Value {
    v.pointer(pointer).unwrap_or(&Value::Null)
}

/// The string at `pointer`, or "".
pub fn text(v: &Value, pointer: &str) -> String {
    get(v, pointer).as_str().unwrap_or_default().to_string()
}
