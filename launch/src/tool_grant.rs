//! Code mode under a policy: the tools a client offers, as its `[tools]`
//! section lets a run call them. The same for every mode: the embedded
//! launcher and pycelld's broker each serve the jail's channel with the
//! [`ToolService`] made here, around their own way to the client's
//! servers.

use std::sync::Arc;

use pycell_policy::Policy;
use pycell_protocol::info::ToolsInfo;
use pycell_protocol::tools::ToolCatalog;
use pycell_tools::allow::Rule;
use pycell_tools::catalog::{Catalog, CatalogError, Toolbox};

use crate::launcher::RequestError;
use pycell_tools::service::{AuditHook, ToolLimits, ToolService, Upstream};

/// What a run may call, and how much.
#[derive(Debug, Clone)]
pub struct ToolGrant {
    pub toolbox: Arc<Toolbox>,
    pub limits: ToolLimits,
}

impl ToolGrant {
    /// The client's `catalog` (as its request carried it) under `policy`;
    /// `Err` says what is wrong with the catalog (a client's mistake).
    pub fn new(policy: &Policy, catalog: &ToolCatalog) -> Result<ToolGrant, RequestError> {
        catalog.check_counts().map_err(bad_catalog)?;
        ToolGrant::of_catalog(policy, &Catalog::from(catalog)).map_err(bad_catalog)
    }

    /// The same for a catalog of our own servers.
    pub fn of_catalog(policy: &Policy, catalog: &Catalog) -> Result<ToolGrant, CatalogError> {
        catalog.check()?;
        let t = &policy.tools;
        // The policy's rules were checked when it was loaded.
        let rules: Vec<Rule> = t.allow.iter().filter_map(|r| Rule::parse(r).ok()).collect();
        Ok(ToolGrant {
            toolbox: Arc::new(Toolbox::new(catalog, &rules)),
            limits: ToolLimits {
                max_calls: t.max_calls,
                max_concurrent: t.max_concurrent,
                call_timeout: t.call_timeout,
                max_result: t.max_result,
            },
        })
    }

    /// The grant of a request that offers `tools` (none: no tools);
    /// a bad catalog is the request's mistake.
    pub fn for_request(
        policy: &Policy,
        tools: Option<&ToolCatalog>,
    ) -> Result<Option<ToolGrant>, crate::launcher::LaunchError> {
        let Some(catalog) = tools else {
            return Ok(None);
        };
        ToolGrant::new(policy, catalog)
            .map(Some)
            .map_err(crate::launcher::LaunchError::Request)
    }

    /// The service for a jail's channel, its calls going to `upstream`.
    pub fn service(self, upstream: Arc<dyn Upstream>, audit: Option<AuditHook>) -> ToolService {
        ToolService {
            toolbox: self.toolbox,
            limits: self.limits,
            upstream,
            audit,
        }
    }
}

/// A client's catalog that is wrong: the request's `tools`.
fn bad_catalog(e: CatalogError) -> RequestError {
    RequestError {
        field: "tools",
        problem: e.to_string(),
    }
}

/// What `sandbox_info` says of a client's tools under `policy`.
pub fn tools_info(policy: &Policy, catalog: &pycell_tools::catalog::Catalog) -> ToolsInfo {
    let unavailable = catalog
        .servers
        .iter()
        .filter_map(|s| {
            s.unavailable
                .as_ref()
                .map(|why| format!("{}: {why}", s.name))
        })
        .collect();
    let callable = ToolGrant::of_catalog(policy, catalog)
        .map(|g| g.toolbox.signatures())
        .unwrap_or_default();
    ToolsInfo {
        callable,
        unavailable,
    }
}
