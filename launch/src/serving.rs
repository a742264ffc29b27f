//! A server over stdio's own request fields (`serve_stdio`, `env`,
//! `allow`, `grants` and the descriptors that come with them), checked the
//! same way wherever the request arrives: in pycelld's broker, and in the
//! embedded run service.

use std::os::fd::OwnedFd;

use pycell_policy::network::{EgressLimits, EgressRules, Rule, RuleKind};
use pycell_policy::{NetworkMode, Policy};
use pycell_protocol::messages::{check_variable, RunRequest};

use crate::launcher::RequestError;

fn bad(field: &'static str, problem: String) -> RequestError {
    RequestError { field, problem }
}

/// The request's grants against the descriptors that came with it: one
/// each, each a directory or a regular file open for reading, shown at a
/// path the jail does not have its own of; only a server over stdio takes
/// them.
pub fn check_grants(request: &RunRequest, fds: &[OwnedFd]) -> Result<(), RequestError> {
    if request.grants.len() != fds.len() {
        return Err(bad(
            "grants",
            format!(
                "{} paths, but {} descriptors came with the message (one each, in order, as SCM_RIGHTS)",
                request.grants.len(),
                fds.len()
            ),
        ));
    }
    if !request.grants.is_empty() && !request.serve_stdio {
        let m = "only a server over stdio (serve_stdio) takes them";
        return Err(bad("grants", m.into()));
    }
    for (g, fd) in request.grants.iter().zip(fds) {
        let t = g.target.display();
        if let Some(p) = pycell_wire::spec::grant_target_problem(&g.target) {
            return Err(bad("grants", p));
        }
        let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| bad("grants", format!("{t}: {e}")))?;
        let mode = rustix::fs::fstat(fd)
            .map_err(|e| bad("grants", format!("{t}: {e}")))?
            .st_mode;
        if let Some(p) = pycell_wire::spec::grant_source_problem(flags.bits(), mode) {
            return Err(bad("grants", format!("{t}: {p}")));
        }
    }
    Ok(())
}

/// A server over stdio's own fields (`serve_stdio`, `env`, `allow`),
/// checked: the egress it is cut down to, if the request names hosts (a
/// client reaches only hosts its policy allows).
pub fn narrowed_egress(
    policy: &Policy,
    request: &RunRequest,
) -> Result<Option<EgressRules>, RequestError> {
    if request.serve_stdio && (request.stdin_base64.is_some() || request.tools.is_some()) {
        let m = "a server over stdio takes no stdin bytes and no tools";
        return Err(bad("serve_stdio", m.into()));
    }
    for (name, value) in &request.env {
        check_variable(name, value).map_err(|e| bad("env", e.to_string()))?;
    }
    if request.allow.is_empty() {
        return Ok(None);
    }
    let Some(rules) = policy.network.egress() else {
        return Err(bad("allow", format!(
            "policy {:?} has no network; through pycelld a run reaches only hosts its policy allows (ask the operator for a policy with [network] mode = \"allowlist\")",
            policy.name
        )));
    };
    rules
        .narrowed_to(&request.allow)
        .map(Some)
        .map_err(|e| bad("allow", format!("{e} in policy {:?}", policy.name)))
}

/// `allow` added to `policy`'s egress (a network of its own if it had
/// none): what the operator, who could write the policy, may ask of a
/// server of theirs (`pycell mcp-server --allow` in embedded mode).
pub fn widen(policy: &mut Policy, allow: &[String]) -> Result<(), RequestError> {
    if allow.is_empty() {
        return Ok(());
    }
    let parsed: Vec<Rule> = allow
        .iter()
        .map(|r| Rule::parse(r, RuleKind::Allow).map_err(|e| bad("allow", format!("{r:?}: {e}"))))
        .collect::<Result<_, _>>()?;
    match &mut policy.network {
        NetworkMode::Allowlist(egress) => egress.allow.extend(parsed),
        none @ NetworkMode::None => {
            *none = NetworkMode::Allowlist(EgressRules {
                allow: parsed,
                deny: Vec::new(),
                limits: EgressLimits::default(),
            })
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The built-in policy `name` (`default` has no network).
    fn policy(name: &str) -> Policy {
        crate::resolve::load_policy_by_name(name, std::path::Path::new("/nonexistent")).unwrap()
    }

    #[test]
    fn widening_opens_an_allowlist_or_adds_to_the_policys() {
        let mut p = policy("default");
        widen(&mut p, &[]).unwrap();
        assert!(p.network.egress().is_none());
        widen(&mut p, &["http://127.0.0.1:8080".into()]).unwrap();
        assert_eq!(
            p.network.egress().unwrap().allowed(),
            ["http://127.0.0.1:8080"]
        );
        widen(&mut p, &["example.net".into()]).unwrap();
        assert_eq!(p.network.egress().unwrap().allow.len(), 2);
        let e = widen(&mut p, &["ftp://x".into()]).unwrap_err();
        assert_eq!(e.field, "allow", "{e}");
        assert!(e.problem.starts_with("\"ftp://x\""), "{e}");
    }

    #[test]
    fn a_client_narrows_only_a_policy_with_a_network() {
        let req = RunRequest {
            serve_stdio: true,
            allow: vec!["api.example.net".to_string()],
            ..RunRequest::default()
        };
        let e = narrowed_egress(&policy("default"), &req).unwrap_err();
        assert_eq!(e.field, "allow");
        assert!(e.problem.contains("has no network"), "{e}");
        let req = RunRequest {
            serve_stdio: true,
            stdin_base64: Some(String::new()),
            ..RunRequest::default()
        };
        assert_eq!(
            narrowed_egress(&policy("default"), &req).unwrap_err().field,
            "serve_stdio"
        );
    }

    #[test]
    fn grants_need_their_descriptors_and_a_server() {
        let req = RunRequest {
            grants: vec![pycell_protocol::messages::PathGrant {
                target: "/srv/data".into(),
                writable: false,
            }],
            ..RunRequest::default()
        };
        let e = check_grants(&req, &[]).unwrap_err();
        assert!(e.problem.contains("1 paths, but 0 descriptors"), "{e}");
        let fd = OwnedFd::from(std::fs::File::open("/").unwrap());
        let e = check_grants(&req, &[fd]).unwrap_err();
        assert!(e.problem.contains("only a server over stdio"), "{e}");
    }
}
