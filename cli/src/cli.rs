//! Command-line syntax.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "pycell",
    version,
    about = "Run untrusted Python in a fail-closed Linux sandbox"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a Python script (or code on stdin with "-") in a sandbox.
    ///
    /// Exit status: the script's own; 128+N if it was killed by signal N;
    /// 124 on timeout; 137 on out-of-memory; 125 if the run was refused or
    /// pycell itself failed.
    Run(RunArgs),
    /// Run many programs, each in a sandbox of its own, as fast as the host
    /// allows: one JSON run request per line of FILE ("-": stdin), one
    /// JSON result per line on stdout.
    ///
    /// A line is a run request as pycelld's protocol has it ({"code": ...,
    /// "args", "stdin_base64", "policy", "limits", "dependencies",
    /// "files"}), with an optional "id" of any JSON value that its result
    /// line repeats. Each result line is {"line": N, "id": ..., "result":
    /// {...}}, in input order unless --unordered; a line that is not a valid
    /// request gets a refused result saying why, and the others still run.
    /// Exit status: 0 when every line got its result, 125 if FILE cannot be
    /// read or the results cannot be written (the lines after are not run).
    Batch(BatchArgs),
    /// Serve the Model Context Protocol on stdin/stdout, for agents' MCP
    /// clients (or, with --http ADDR, over HTTP for remote agents).
    ///
    /// Tools: run_python (run code in a fresh sandbox) and sandbox_info
    /// (policies, limits, isolation status). Configure a client with
    /// {"command": "pycell", "args": ["mcp"]}. With no pycelld daemon the
    /// sandboxes are built through pycell-jailer by this process (embedded
    /// mode), which needs root.
    #[cfg(feature = "mcp")]
    Mcp(crate::mcp_args::McpArgs),
    /// Run a Python MCP server from the package index, jailed: a drop-in
    /// for `uvx PACKAGE ARGS` in an MCP host's config
    /// ({"command": "pycell", "args": ["mcp-server", "mcp-server-time"]}).
    ///
    /// PACKAGE (and --with) are installed wheels-only into pycell's env
    /// store (no build code runs; cached), its console script is found
    /// offline in a jail without network, and the server runs in a jail
    /// whose stdin and stdout are this process's, relayed unchanged. It sees
    /// no host file but those granted (--ro, --rw, --state), no variable
    /// but those named (--env), and no network but the hosts allowed
    /// (--allow), whose use is summed up on exit. Through pycelld when it
    /// runs (the operator's policies; --allow only hosts the policy
    /// allows), else embedded (as root). Exit status: the server's own; 125
    /// if it could not start.
    McpServer(McpServerArgs),
    /// Make a bearer token for `pycell mcp --http --tokens FILE`: prints
    /// the token (on stderr: give it to the caller, it is stored nowhere)
    /// and the [[token]] entry for FILE (on stdout, its SHA-256 only), as
    /// in `pycell mcp-token ci-bot >> /etc/pycell/mcp-tokens.toml`.
    #[cfg(feature = "mcp")]
    McpToken(crate::mcp_args::McpTokenArgs),
    /// A cluster node's door for `pycell mcp --http` front ends on other
    /// hosts: mutual TLS (certificates of the cluster's CA) carried to this
    /// node's pycelld, which must list this process's uid in
    /// `front_end_uids`. See docs/cluster.md.
    #[cfg(feature = "mcp")]
    Gateway(crate::mcp_args::GatewayArgs),
    /// Sessions: a sandbox whose Python stays alive between commands, like
    /// a Jupyter kernel (variables, imports and /workspace files persist).
    ///
    /// A session outlives one command, so it lives in pycelld: these
    /// commands need the daemon. `pycell repl` needs none.
    Session(SessionArgs),
    /// An interactive Python prompt on a session: each line (or block) runs
    /// in the sandbox as a cell, values and errors show as in python's own
    /// prompt, with line editing and history. ^C interrupts a cell; ^D ends
    /// the session.
    Repl(ReplArgs),
    /// Work with policy files.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Build, list, remove or garbage-collect the envs of installed
    /// dependencies (embedded mode's store: /var/cache/pycell; pycelld's:
    /// /var/lib/pycell, with --store).
    Env(EnvArgs),
    /// Show pycell's version, built-in policies, and what this host can enforce.
    Info {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Developer tools.
    #[command(subcommand, hide = true)]
    Debug(DebugCommand),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate policy files; prints "FILE: ok (policy NAME)" or the error.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct EnvArgs {
    /// The env store to use (default /var/cache/pycell, embedded mode's;
    /// pycelld's is /var/lib/pycell).
    #[arg(long, global = true, value_name = "DIR", env = "PYCELL_ENV_STORE")]
    pub store: Option<PathBuf>,
    #[command(subcommand)]
    pub command: EnvCommand,
}

#[derive(Debug, Subcommand)]
pub enum EnvCommand {
    /// Build the env a run would get (or find it built), without running
    /// anything: for a script's PEP 723 block, --with packages, a
    /// requirements file, or the policy's own [dependencies] packages.
    /// Needs root (it runs the install jail).
    Build(EnvBuildArgs),
    /// One line per env, least recently used first: key, size, last use,
    /// packages (or one JSON array with --json).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove envs unused for longer than --max-age, then the least
    /// recently used until the rest fit in --max-size; never one in use.
    Gc {
        /// e.g. 10GiB.
        #[arg(long, value_name = "SIZE", default_value = "10GiB")]
        max_size: String,
        /// e.g. 30d is not a unit: use hours, e.g. 720h.
        #[arg(long, value_name = "DURATION", default_value = "720h")]
        max_age: String,
    },
    /// Remove envs by key (or a unique prefix of one); refused while in use.
    Rm {
        #[arg(required = true)]
        keys: Vec<String>,
    },
}

#[derive(Debug, Args, Clone)]
pub struct EnvBuildArgs {
    /// A script whose `# /// script` block names dependencies ("-": stdin).
    pub script: Option<PathBuf>,
    /// The policy whose runs will use the env (its install policy builds it).
    #[arg(long, default_value = "default")]
    pub policy: String,
    /// A package to install (repeatable), e.g. --with "pandas>=2.2".
    #[arg(long = "with", value_name = "PKG")]
    pub with: Vec<String>,
    /// Install the packages listed in a requirements file (no pip options).
    #[arg(long, value_name = "FILE")]
    pub requirements: Option<PathBuf>,
    /// The Python versions the env is for, as a script's requires-python.
    #[arg(long, value_name = "SPEC")]
    pub requires_python: Option<String>,
    /// Print one JSON object: {"outcome": "ready", "env": ...} or
    /// {"outcome": "failed", "failure": ...}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum DebugCommand {
    /// Print the resolved jail spec that `pycell-jailer` takes on stdin.
    Spec(RunArgs),
}

#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// The Python file to run, or "-" to read the code from stdin.
    pub script: PathBuf,
    /// Arguments passed to the script (after "--").
    #[arg(last = true)]
    pub script_args: Vec<String>,
    /// Policy name (looked up in /etc/pycell/policies, then built in) or a path to a .toml file.
    #[arg(long, default_value = "default")]
    pub policy: String,
    /// Print one JSON result object instead of streaming the output.
    #[arg(long)]
    pub json: bool,
    /// Wall-clock timeout in seconds (fractions allowed).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<String>,
    /// Memory limit, e.g. 256M or 1GiB (no swap).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Maximum number of processes and threads.
    #[arg(long, value_name = "N")]
    pub pids: Option<u32>,
    /// Bytes the run may store in /workspace, /tmp and /dev/shm together.
    #[arg(long, value_name = "SIZE")]
    pub disk: Option<String>,
    /// Cap for each of stdout and stderr.
    #[arg(long, value_name = "SIZE")]
    pub max_output: Option<String>,
    /// Install a package for this run (repeatable), e.g. --with "pandas>=2.2".
    /// Added to a PEP 723 `# /// script` block's dependencies, if the script has one.
    #[arg(long = "with", value_name = "PKG")]
    pub with: Vec<String>,
    /// Install the packages listed in a requirements file (no pip options).
    #[arg(long, value_name = "FILE")]
    pub requirements: Option<PathBuf>,
    /// File whose contents become the script's stdin (default: empty).
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// MCP servers whose tools the code may call (`import pycell_tools`),
    /// in the mcpServers format MCP hosts use; this process starts them.
    #[arg(long, value_name = "FILE")]
    pub tool_servers: Option<PathBuf>,
    /// pycelld socket to use. Without it (and without PYCELL_SOCKET), pycell
    /// uses /run/pycell/pycell.sock if it exists, else runs embedded (as root).
    #[arg(long, value_name = "PATH", env = "PYCELL_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Run embedded (this process starts pycell-jailer; needs root) even if
    /// pycelld is running.
    #[arg(long, conflicts_with = "socket")]
    pub embedded: bool,
    /// Say where the run's start and end spent their time: each step of
    /// this process, the jailer and the jail, on stderr (with --json, in
    /// the result's `timings`). Implies --embedded.
    #[arg(long, conflicts_with = "socket")]
    pub timings: bool,
}

/// `pycell batch`.
#[derive(Debug, Args, Clone)]
pub struct BatchArgs {
    /// The requests, one JSON object per line ("-": stdin).
    pub file: PathBuf,
    /// Runs at once (default: the number of CPUs this process may use).
    /// Through pycelld, its own admission decides what runs at once.
    #[arg(long, short = 'j', value_name = "N")]
    pub jobs: Option<usize>,
    /// Write each result as soon as its run ends, not in input order.
    #[arg(long)]
    pub unordered: bool,
    /// Policy of lines that name none.
    #[arg(long, default_value = "default")]
    pub policy: String,
    /// pycelld socket to use (default as for `pycell run`).
    #[arg(long, value_name = "PATH", env = "PYCELL_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Run embedded (this process starts the jailers; needs root) even if
    /// pycelld is running.
    #[arg(long, conflicts_with = "socket")]
    pub embedded: bool,
    /// Embedded: start python once (a zygote, with the policy's warm
    /// imports) and fork each run's jail from it instead of starting
    /// python per run. Runs of --policy without dependencies take this
    /// path; each still gets its own jail, uid, cgroup and limits.
    #[arg(long, requires = "embedded")]
    pub zygote: bool,
}

/// Where a session lives.
#[derive(Debug, Args, Clone)]
pub struct DaemonArgs {
    /// pycelld socket to use (default: $PYCELL_SOCKET, else
    /// /run/pycell/pycell.sock).
    #[arg(long, value_name = "PATH", env = "PYCELL_SOCKET", global = true)]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SessionArgs {
    #[command(flatten)]
    pub daemon: DaemonArgs,
    #[command(subcommand)]
    pub command: SessionCommand,
}

/// How a session is started: its policy, packages and limits.
#[derive(Debug, Args, Clone)]
pub struct SessionStartArgs {
    /// Policy name (installed or built in).
    #[arg(long, default_value = "default")]
    pub policy: String,
    /// A package the session has (repeatable), e.g. --with "pandas>=2.2".
    #[arg(long = "with", value_name = "PKG")]
    pub with: Vec<String>,
    /// Memory limit of the whole session, e.g. 1GiB.
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Each cell's default wall-clock timeout in seconds.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<String>,
    /// Start from a snapshot (`pycell session snapshot`): its policy,
    /// packages and limits, then its variables and files.
    #[arg(long, value_name = "ID", conflicts_with_all = ["policy", "with", "memory", "timeout"])]
    pub from_snapshot: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Start a session; prints its handle (or one JSON object with --json).
    Start {
        #[command(flatten)]
        how: SessionStartArgs,
        #[arg(long)]
        json: bool,
    },
    /// Run a file (or code on stdin with "-", or --code) as the session's
    /// next cell: its output, then the value of a last expression. Exit
    /// status: 0; 1 if the cell raised; 124 if it was interrupted at its
    /// timeout; 125 if the session refused (e.g. it ended).
    Run {
        session: String,
        /// The code's file, or "-" for stdin.
        #[arg(required_unless_present = "code")]
        file: Option<PathBuf>,
        /// The code itself.
        #[arg(long, conflicts_with = "file")]
        code: Option<String>,
        /// Wall-clock timeout of this cell in seconds.
        #[arg(long, value_name = "SECS")]
        timeout: Option<f64>,
        /// Print the answer as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Copy a local file into the session's /workspace.
    Put {
        session: String,
        local: PathBuf,
        /// Its path in /workspace (default: the local file's name).
        remote: Option<String>,
    },
    /// Copy a file of the session's /workspace out ("-" or no LOCAL: stdout).
    Get {
        session: String,
        remote: String,
        local: Option<PathBuf>,
    },
    /// List a directory of the session's /workspace.
    Ls {
        session: String,
        #[arg(default_value = "")]
        path: String,
    },
    /// End a session: its processes and files are gone.
    End { session: String },
    /// Keep a session's variables, imports and /workspace in pycelld's
    /// snapshot store (they outlive the session and pycelld's restarts);
    /// prints the snapshot's id, for `start --from-snapshot`.
    Snapshot {
        session: String,
        #[arg(long)]
        json: bool,
    },
    /// Fork a session: a new one whose variables, imports and /workspace
    /// are a copy of SESSION's, in a sandbox of its own; prints the new
    /// handle and what was not carried (one JSON object with --json).
    Fork {
        session: String,
        #[arg(long)]
        json: bool,
    },
    /// Your open sessions.
    List {
        #[arg(long)]
        json: bool,
    },
}

/// `pycell repl`.
#[derive(Debug, Args, Clone)]
pub struct ReplArgs {
    #[command(flatten)]
    pub how: SessionStartArgs,
    /// pycelld socket to use. Without it (and without PYCELL_SOCKET), the
    /// repl uses /run/pycell/pycell.sock if it exists, else holds its
    /// session itself (embedded, as root).
    #[arg(long, value_name = "PATH", env = "PYCELL_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Hold the session in this process (needs root) even if pycelld runs.
    #[arg(long, conflicts_with = "socket")]
    pub embedded: bool,
}

/// `pycell mcp-server`.
#[derive(Debug, Args, Clone)]
pub struct McpServerArgs {
    /// The package to run, as a requirement (`mcp-server-time`,
    /// `mcp-server-fetch==2026.10.24`).
    #[arg(value_name = "PACKAGE")]
    pub package: String,
    /// The server's own arguments (after `--`).
    #[arg(last = true, value_name = "ARGS")]
    pub server_args: Vec<String>,
    /// Install this package too (repeatable).
    #[arg(long = "with", value_name = "PKG")]
    pub with: Vec<String>,
    /// What to run: a console script of the installed packages, or
    /// MODULE:FUNCTION (default: PACKAGE's console script).
    #[arg(long, value_name = "NAME", conflicts_with = "module")]
    pub entry: Option<String>,
    /// Run a module as `python -m MODULE` does.
    #[arg(short = 'm', long, value_name = "MODULE")]
    pub module: Option<String>,
    /// Policy of the server's jail (name, or path to a .toml file).
    #[arg(long, default_value = "mcp-server", value_name = "NAME")]
    pub policy: String,
    /// Grant a host path read-only, at the same path in the jail
    /// (repeatable).
    #[arg(long = "ro", value_name = "PATH")]
    pub read_only: Vec<PathBuf>,
    /// Grant a host path read-write, at the same path in the jail
    /// (repeatable).
    #[arg(long = "rw", value_name = "PATH")]
    pub read_write: Vec<PathBuf>,
    /// The server's persistent state: DIR, made if missing (mode 0700),
    /// granted read-write at the same path; refused if it already holds
    /// more than the policy's disk limit.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// Pass a variable: NAME (its value in this process's environment, so
    /// that a secret never shows on a command line) or NAME=VALUE
    /// (repeatable).
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// Let the server reach this host through pycell's egress proxy:
    /// `[SCHEME://]HOST[:PORT]` as in a policy's [network] allow
    /// (repeatable).
    #[arg(long, value_name = "RULE")]
    pub allow: Vec<String>,
    /// On exit, write the server's egress (hosts reached, requests
    /// refused) to FILE as JSON too.
    #[arg(long, value_name = "FILE")]
    pub egress_report: Option<PathBuf>,
    /// pycelld socket to use (default as for `pycell run`).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Run embedded (this process starts pycell-jailer; needs root) even if
    /// pycelld is running.
    #[arg(long, conflicts_with = "socket")]
    pub embedded: bool,
}
