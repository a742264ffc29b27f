//! The messages of `pycell-jailer --fork-server` ([`ARG`]): a jailer that
//! stays, started by pycelld's monitor, and forks each run's jailer
//! instead of the monitor executing `pycell-jailer` anew. Each message is
//! one datagram on a `SOCK_SEQPACKET` pair: a [`ForkJailer`] request with
//! the new jailer's stdin (a unix socket, on which its spec comes as
//! always) and stdout (its event pipe) attached, in that order; the
//! answer, a [`Forked`].
//!
//! The jailer forked is the monitor's child (`CLONE_PARENT`): the monitor
//! reaps it, and its parent-death signal follows the monitor, as an
//! executed one's does.

/// The argument that makes `pycell-jailer` a fork server.
pub const ARG: &str = "--fork-server";

/// The server's process name (`comm`), told apart from its jailers'
/// (which, forked from it, share its command line).
pub const NAME: &str = "jailer-forks";

/// A jailer's process name, executed or forked.
pub const JAILER_NAME: &str = "pycell-jailer";

/// The descriptors that come with a [`ForkJailer`]: stdin, stdout.
pub const DESCRIPTORS: usize = 2;

/// Ask for one jailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ForkJailer {
    /// In a process group of its own (a session's: interrupted by its
    /// launcher, never by a terminal's ^C).
    pub new_process_group: bool,
}

const NEW_PROCESS_GROUP: u8 = 1;

impl ForkJailer {
    pub fn encode(&self) -> [u8; 1] {
        [if self.new_process_group {
            NEW_PROCESS_GROUP
        } else {
            0
        }]
    }

    /// A request as sent: one byte, no bit set but ours.
    pub fn decode(bytes: &[u8]) -> Result<ForkJailer, String> {
        match bytes {
            [b] if b & !NEW_PROCESS_GROUP == 0 => Ok(ForkJailer {
                new_process_group: b & NEW_PROCESS_GROUP != 0,
            }),
            [b] => Err(format!("unknown request bits {b:#04x}")),
            _ => Err(format!("a request is 1 byte, not {}", bytes.len())),
        }
    }
}

/// The answer to a [`ForkJailer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The new jailer's pid.
    Pid(i32),
    /// No jailer: this errno says why.
    Failed(i32),
}

impl Forked {
    /// A pid as itself, an errno negated.
    pub fn encode(&self) -> [u8; 4] {
        match *self {
            Forked::Pid(pid) => pid.to_le_bytes(),
            Forked::Failed(errno) => errno.saturating_neg().to_le_bytes(),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Forked, String> {
        let raw: [u8; 4] = bytes
            .try_into()
            .map_err(|_| format!("an answer is 4 bytes, not {}", bytes.len()))?;
        match i32::from_le_bytes(raw) {
            0 => Err("an answer of 0 is neither a pid nor an errno".to_string()),
            n if n > 0 => Ok(Forked::Pid(n)),
            n => Ok(Forked::Failed(n.saturating_neg())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_unknown_bits_are_refused() {
        for new_process_group in [false, true] {
            let r = ForkJailer { new_process_group };
            assert_eq!(ForkJailer::decode(&r.encode()), Ok(r));
        }
        assert!(ForkJailer::decode(&[0x02]).unwrap_err().contains("0x02"));
        assert!(ForkJailer::decode(&[]).is_err());
        assert!(ForkJailer::decode(&[0, 0]).is_err());
    }

    #[test]
    fn answers_round_trip_and_zero_is_refused() {
        for a in [Forked::Pid(1), Forked::Pid(i32::MAX), Forked::Failed(11)] {
            assert_eq!(Forked::decode(&a.encode()), Ok(a));
        }
        assert!(Forked::decode(&0i32.to_le_bytes()).is_err());
        assert!(Forked::decode(&[1, 2, 3]).is_err());
    }
}
