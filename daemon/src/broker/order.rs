//! From a client's request to the [`RunOrder`] the monitor is sent: all
//! the parsing of client input happens here, in the unprivileged broker
//! (the policy looked up by name, the limits checked against its
//! ceilings, the PEP 723 block and the requirement lists gathered and
//! normalized), so that root only re-checks bounds.

use std::os::fd::OwnedFd;
use std::path::Path;

use pycell_launch::launcher::LaunchError;
use pycell_launch::resolve;
use pycell_launch::serving::{check_grants, narrowed_egress};
use pycell_launch::tool_grant::ToolGrant;
use pycell_policy::network::EgressRules;
use pycell_protocol::messages::{ErrorCode, RunRequest};
use pycell_wire::report::JailFailure;

use crate::link::{refusal, RunOrder};

/// Why a request gets no order.
#[derive(Debug)]
pub(crate) enum NotOrdered {
    /// Refused on the wire: an unknown policy, limits over its ceilings.
    Refused(ErrorCode, String),
    /// A run that never starts, with a result saying why (its
    /// dependencies are invalid or not allowed).
    Failed {
        policy: String,
        failure: JailFailure,
    },
}

/// A run as ordered, what its code may call (code mode) and, when the
/// request narrowed it, the egress it may have: both served by the broker
/// itself.
#[derive(Debug)]
pub(crate) struct Ordered {
    pub(crate) order: RunOrder,
    pub(crate) tools: Option<ToolGrant>,
    pub(crate) egress: Option<EgressRules>,
    /// The descriptors of `order.grants`, in order, checked.
    pub(crate) grant_sources: Vec<OwnedFd>,
}

/// The order for `request` under the operator's policies in `policy_dir`.
pub(crate) fn order(
    policy_dir: &Path,
    request: RunRequest,
    grant_sources: Vec<OwnedFd>,
) -> Result<Ordered, NotOrdered> {
    // Sizes and counts first, before anything that grows with them.
    request
        .check_bounds()
        .map_err(|e| NotOrdered::Refused(ErrorCode::InvalidRequest, e.to_string()))?;
    check_grants(&request, &grant_sources)
        .map_err(|e| NotOrdered::Refused(ErrorCode::InvalidRequest, e.to_string()))?;
    let refused = |e: resolve::ResolveError| {
        let (code, message) = refusal(LaunchError::from(e));
        NotOrdered::Refused(code, message)
    };
    let policy =
        resolve::load_policy_by_name(request.policy_name(), policy_dir).map_err(refused)?;
    if let Some(m) = policy.purpose_problem(request.serve_stdio) {
        return Err(NotOrdered::Refused(ErrorCode::InvalidRequest, m));
    }
    let limits = resolve::effective_limits(&policy, &request.limits).map_err(refused)?;
    let dependencies =
        pycell_deps::gather(&policy, &request.code, &request.dependencies).map_err(|failure| {
            NotOrdered::Failed {
                policy: policy.name.clone(),
                failure,
            }
        })?;
    let egress = narrowed_egress(&policy, &request)
        .map_err(|e| NotOrdered::Refused(ErrorCode::InvalidRequest, e.to_string()))?;
    let tools = match &request.tools {
        Some(catalog) => Some(
            ToolGrant::new(&policy, catalog)
                .map_err(|e| NotOrdered::Refused(ErrorCode::InvalidRequest, e.to_string()))?,
        ),
        None => None,
    };
    let order = RunOrder {
        tools: tools.is_some(),
        policy: policy.name,
        limits: limits.clone(),
        code: request.code,
        filename: request.filename,
        args: request.args,
        stdin_base64: request.stdin_base64,
        files: request.files,
        dependencies,
        session: false,
        stdio: request.serve_stdio,
        env: request.env,
        grants: request.grants,
    };
    Ok(Ordered {
        order,
        tools,
        egress,
        grant_sources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pycell_protocol::messages::LimitOverrides;
    use pycell_wire::codes::FailureCode;

    fn request(code: &str, policy: &str) -> RunRequest {
        RunRequest {
            code: code.into(),
            policy: Some(policy.into()),
            ..Default::default()
        }
    }

    #[test]
    fn an_order_carries_final_limits_and_normalized_dependencies() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = request(
            "# /// script\n# dependencies = [\"Six\"]\n# ///\nprint(1)\n",
            "default",
        );
        r.limits = LimitOverrides {
            timeout_s: Some(2.5),
            ..Default::default()
        };
        r.dependencies = vec!["attrs >= 23".into(), "six".into()];
        let o = order(dir.path(), r.clone(), Vec::new()).unwrap().order;
        assert_eq!(o.policy, "default");
        assert_eq!(o.limits.wall_timeout.as_secs_f64(), 2.5);
        let defaults = pycell_policy::builtin::load("default").unwrap().limits;
        assert_eq!(o.limits.memory, defaults.memory);
        let deps = o.dependencies.clone().unwrap();
        assert_eq!(deps.requirements, ["six", "attrs>=23"]);
        assert_eq!(o.code, r.code);
        // What the monitor launches: these limits, no dependencies.
        let policy = pycell_policy::builtin::load("default").unwrap();
        let settled = pycell_launch::resolve::settled_limits(&policy, &o.limits).unwrap();
        assert_eq!(settled.wall_timeout, std::time::Duration::from_millis(2500));
        let back = o.to_request();
        assert_eq!(back.limits, LimitOverrides::default());
        assert!(back.dependencies.is_empty());
    }

    #[test]
    fn bad_policies_and_limits_are_refused_bad_dependencies_fail() {
        let dir = tempfile::tempdir().unwrap();
        match order(dir.path(), request("", "no-such-policy"), Vec::new()) {
            Err(NotOrdered::Refused(ErrorCode::InvalidRequest, m)) => {
                assert!(m.contains("no policy named"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        let mut r = request("", "default");
        r.limits.timeout_s = Some(1e9);
        assert!(matches!(
            order(dir.path(), r, Vec::new()),
            Err(NotOrdered::Refused(ErrorCode::InvalidRequest, _))
        ));
        let mut r = request("", "default");
        r.dependencies = vec!["bad >> 1".into()];
        match order(dir.path(), r, Vec::new()) {
            Err(NotOrdered::Failed { policy, failure }) => {
                assert_eq!(policy, "default");
                assert_eq!(failure.code, FailureCode::DepsInvalid);
            }
            other => panic!("{other:?}"),
        }
    }
}
