//! `pycell`: the client. `pycell run` executes Python in a pycell sandbox
//! (through pycelld's socket, or embedded: this process leases the sandbox
//! uid and starts `pycell-jailer` itself, which needs root); `pycell mcp` is
//! the stdio MCP server for agents (the same two modes); `pycell policy
//! check` validates policy files; `pycell info` reports what this host can
//! enforce.
//!
//! Threat model: this process handles the user's own input (flags, files,
//! policies) and never runs the untrusted code itself; everything the code
//! can reach is decided by the jailer from the resolved spec.
#![forbid(unsafe_code)]

mod batch;
mod cli;
mod env_cmd;
mod info;
mod jailed_server;
/// The MCP commands' flags (a module of their own here so that the man
/// pages' tool, which compiles `cli.rs` and `mcp/src/args.rs` by path,
/// finds them at the same place).
#[cfg(feature = "mcp")]
mod mcp_args {
    pub use pycell_mcp::args::*;
}
mod policy_cmd;
mod repl;
mod run;
mod say;
mod session_cmd;

use clap::Parser;

fn main() {
    run::STARTED_US.get_or_init(pycell_wire::timings::now_us);
    #[cfg(not(feature = "mcp"))]
    refuse_mcp_commands();
    let cli = cli::Cli::parse();
    let code = match cli.command {
        cli::Command::Run(args) => run::main(&args),
        cli::Command::Batch(args) => batch::main(&args),
        #[cfg(feature = "mcp")]
        cli::Command::Mcp(args) => match &args.http {
            Some(addr) => pycell_mcp::http::main(&args, addr),
            None => pycell_mcp::server::main(&args),
        },
        #[cfg(feature = "mcp")]
        cli::Command::McpToken(args) => pycell_mcp::http::token_cmd::main(&args),
        #[cfg(feature = "mcp")]
        cli::Command::Gateway(args) => pycell_mcp::cluster::gateway::main(&args),
        cli::Command::McpServer(args) => jailed_server::main(&args),
        cli::Command::Session(args) => session_cmd::main(&args),
        cli::Command::Repl(args) => repl::main(&args),
        cli::Command::Policy(cli::PolicyCommand::Check { files }) => policy_cmd::check(&files),
        cli::Command::Env(args) => env_cmd::main(&args),
        cli::Command::Info { json } => info::main(json),
        cli::Command::Debug(cli::DebugCommand::Spec(args)) => run::print_spec(&args),
    };
    std::process::exit(code);
}

/// In a pycell built without its feature `mcp`: say so for the commands
/// that need it, rather than clap's "unrecognized subcommand".
#[cfg(not(feature = "mcp"))]
fn refuse_mcp_commands() {
    let command = std::env::args().nth(1).unwrap_or_default();
    if ["mcp", "mcp-token", "gateway"].contains(&command.as_str()) {
        eprintln!("pycell: `pycell {command}` is not in this build: it was built without its feature `mcp` (the MCP SDK, HTTP and TLS), as scripts/pycell does for commands that need none; build it with default features (`cargo build --release -p pycell`, or `scripts/pycell {command} ...`)");
        std::process::exit(2);
    }
}
