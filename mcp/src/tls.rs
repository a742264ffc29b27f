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

/// Why a TLS configuration could not be made: which file, and why.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {source}", .path.display())]
    Pem {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("{}: no certificate in it", .0.display())]
    NoCertificate(PathBuf),
    #[error("{}: {source}", .path.display())]
    Refused {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("{}: {source}", .path.display())]
    ClientCa {
        path: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
    #[error("TLS: {0}")]
    Versions(rustls::Error),
}

fn pem(path: &Path) -> impl FnOnce(rustls_pki_types::pem::Error) -> TlsError + '_ {
    move |source| TlsError::Pem {
        path: path.to_path_buf(),
        source,
    }
}

fn refused(path: &Path) -> impl FnOnce(rustls::Error) -> TlsError + '_ {
    move |source| TlsError::Refused {
        path: path.to_path_buf(),
        source,
    }
}

fn chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|c| c.collect::<Result<Vec<_>, _>>())
        .map_err(pem(path))?;
    match certs.is_empty() {
        true => Err(TlsError::NoCertificate(path.to_path_buf())),
        false => Ok(certs),
    }
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(pem(path))
}

fn roots(ca: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in chain(ca)? {
        roots.add(c).map_err(refused(ca))?;
    }
    Ok(roots)
}

/// A server with `cert` and `key`; with `client_ca`, only clients with a
/// certificate that CA signed get in. HTTP/2 and HTTP/1.1 by ALPN.
pub fn server(
    cert: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Versions)?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                provider(),
            )
            .build()
            .map_err(|source| TlsError::ClientCa {
                path: ca.to_path_buf(),
                source,
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain(cert)?, key(key_file)?)
        .map_err(refused(cert))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client that trusts `files.ca` only and proves itself with `files.cert`.
pub fn client(files: &TlsFiles) -> Result<Arc<ClientConfig>, TlsError> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Versions)?
        .with_root_certificates(roots(&files.ca)?)
        .with_client_auth_cert(chain(&files.cert)?, key(&files.key)?)
        .map_err(refused(&files.cert))?;
    Ok(Arc::new(config))
}
