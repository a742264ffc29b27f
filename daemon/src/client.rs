//! A blocking client of pycelld, used by `pycell run` (and available to
//! anything that can afford a thread per run).

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::framing::{self, FrameError};
use crate::protocol::{
    decode_b64, ClientMessage, ErrorCode, RunRequest, ServerMessage, Stream, PROTOCOL_VERSION,
};
use crate::result::RunResult;

/// Where clients look for the daemon unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/pycell/pycell.sock";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to pycelld at {path}: {source}")]
    Connect { path: PathBuf, source: io::Error },
    #[error("pycelld: {0}")]
    Frame(#[from] FrameError),
    #[error("pycelld refused ({code}): {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("pycelld sent an unexpected message: {0}")]
    Unexpected(String),
}

#[derive(Debug)]
pub struct DaemonClient {
    stream: UnixStream,
}

impl DaemonClient {
    /// Connect and do the version handshake.
    pub fn connect(path: &Path) -> Result<DaemonClient, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        let mut c = DaemonClient { stream };
        let hello = framing::write_sync(
            &mut c.stream,
            &ClientMessage::Hello {
                version: PROTOCOL_VERSION,
                client: format!("pycell {}", env!("CARGO_PKG_VERSION")),
            },
        );
        // A daemon that refuses us (unauthorized) says why and hangs up
        // without reading: its reason may already be waiting even though
        // our hello could not be written.
        let reply = framing::read_sync::<ServerMessage>(&mut c.stream);
        let reply = match (hello, reply) {
            (_, Ok(r)) => r,
            (Err(e), Err(_)) => return Err(e.into()),
            (Ok(()), Err(e)) => return Err(e.into()),
        };
        match reply {
            ServerMessage::Welcome { .. } => Ok(c),
            ServerMessage::Error { code, message, .. } => {
                Err(ClientError::Refused { code, message })
            }
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// A handle that can cancel the current run from another thread.
    pub fn canceller(&self) -> io::Result<Canceller> {
        Ok(Canceller {
            stream: self.stream.try_clone()?,
        })
    }

    /// Run `request`, calling `on_output` for each chunk as it arrives.
    pub fn run(
        &mut self,
        request: RunRequest,
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<RunResult, ClientError> {
        framing::write_sync(
            &mut self.stream,
            &ClientMessage::Run {
                id: "1".into(),
                request,
            },
        )?;
        loop {
            match framing::read_sync::<ServerMessage>(&mut self.stream)? {
                ServerMessage::Started { .. } => {}
                ServerMessage::Output {
                    stream,
                    data_base64,
                    ..
                } => {
                    let bytes = decode_b64(&data_base64).map_err(ClientError::Unexpected)?;
                    on_output(stream, &bytes);
                }
                ServerMessage::Result { result, .. } => return Ok(*result),
                ServerMessage::Error { code, message, .. } => {
                    // An error about a stray cancel does not end the run.
                    if code == ErrorCode::NoSuchRun {
                        continue;
                    }
                    return Err(ClientError::Refused { code, message });
                }
                other => return Err(ClientError::Unexpected(format!("{other:?}"))),
            }
        }
    }

    pub fn info(&mut self) -> Result<serde_json::Value, ClientError> {
        framing::write_sync(&mut self.stream, &ClientMessage::Info)?;
        match framing::read_sync::<ServerMessage>(&mut self.stream)? {
            ServerMessage::Info { info } => Ok(info),
            ServerMessage::Error { code, message, .. } => {
                Err(ClientError::Refused { code, message })
            }
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}

#[derive(Debug)]
pub struct Canceller {
    stream: UnixStream,
}

impl Canceller {
    pub fn cancel(&mut self) -> Result<(), ClientError> {
        framing::write_sync(&mut self.stream, &ClientMessage::Cancel { id: "1".into() })?;
        Ok(())
    }
}
