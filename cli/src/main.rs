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
mod cluster;
mod env_cmd;
mod info;
mod jailed_server;
mod mcp_http;
mod mcp_lines;
mod mcp_server;
mod policy_cmd;
mod privileges;
mod repl;
mod run;
mod say;
mod serving;
mod session_cmd;
mod tls;
mod tool_servers;

use clap::Parser;

fn main() {
    run::STARTED_US.get_or_init(pycell_wire::timings::now_us);
    let cli = cli::Cli::parse();
    let code = match cli.command {
        cli::Command::Run(args) => run::main(&args),
        cli::Command::Batch(args) => batch::main(&args),
        cli::Command::Mcp(args) => match &args.http {
            Some(addr) => mcp_http::main(&args, addr),
            None => mcp_server::main(&args),
        },
        cli::Command::McpToken(args) => mcp_http::token_cmd::main(&args),
        cli::Command::Gateway(args) => cluster::gateway::main(&args),
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
