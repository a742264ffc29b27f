//! The egress proxy outside any jail, for measuring it: listens on
//! 127.0.0.1:PORT (first argument; 0 picks one, printed), allowing the
//! rules given as the other arguments, until stdin closes.
//!
//!   cargo run --release -p pycell-egress --example standalone -- 0 tcp://127.0.0.1:9000

use std::io::Read;
use std::os::fd::OwnedFd;

use pycell_egress::{Egress, EgressConfig, Upstream};
use pycell_policy::network::{EgressLimits, EgressRules};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let port: u16 = args.first().and_then(|p| p.parse().ok()).expect("PORT");
    let limits = EgressLimits {
        max_connections: 65536,
        max_bytes: u64::MAX,
        ..EgressLimits::default()
    };
    let no_deny: &[&str] = &[];
    let rules = EgressRules::from_texts(&args[1..], no_deny, limits).expect("rules");
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
    println!("{}", listener.local_addr().expect("addr").port());
    let config = EgressConfig {
        policy: "standalone".into(),
        rules,
        upstream: Ok(Upstream::default()),
    };
    let egress = Egress::start_on_thread(OwnedFd::from(listener), config, None).expect("start");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let report = egress.finish_blocking();
    eprintln!("{report:?}");
}
