//! TLS configurations (rustls, ring) from PEM files: the HTTPS front end's
//! (`pycell mcp --http --tls-cert`), and the mutual TLS between front ends
//! and gateways (`crate::cluster::tunnel`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};

/// A certificate, its key and the CA that signs the other side's.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|c| c.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    match certs.is_empty() {
        true => Err(format!("{}: no certificate in it", path.display())),
        false => Ok(certs),
    }
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn roots(ca: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for c in chain(ca)? {
        roots.add(c).map_err(|e| format!("{}: {e}", ca.display()))?;
    }
    Ok(roots)
}

/// A server with `cert` and `key`; with `client_ca`, only clients with a
/// certificate that CA signed get in. HTTP/2 and HTTP/1.1 by ALPN.
pub fn server(
    cert: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, String> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                provider(),
            )
            .build()
            .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain(cert)?, key(key_file)?)
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client that trusts `files.ca` only and proves itself with `files.cert`.
pub fn client(files: &TlsFiles) -> Result<Arc<ClientConfig>, String> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(&files.ca)?)
        .with_client_auth_cert(chain(&files.cert)?, key(&files.key)?)
        .map_err(|e| format!("{}: {e}", files.cert.display()))?;
    Ok(Arc::new(config))
}
