//! Serving as an unprivileged user: processes that parse bytes from the
//! network (`pycell mcp --http`, `pycell gateway`) may be started as root
//! (to bind a low port, read a key only root reads), then become `--user`
//! for good before they parse anything.

use std::path::PathBuf;

use nix::unistd::{Gid, Uid, User};

/// Why this process cannot serve as the user it should.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
    #[error("{what} and does not run as root: give --user NAME (it binds its address and reads its files as root, then serves as NAME), or start it as that user")]
    RootWithoutUser { what: String },
    #[error("--user {name}: no such user")]
    NoSuchUser { name: String },
    #[error("--user {name}: {error}")]
    Lookup { name: String, error: nix::Error },
    #[error("--user {name}: that is root; name an unprivileged user")]
    IsRoot { name: String },
    #[error("--user {name}: only root can become another user")]
    NotRoot { name: String },
    #[error("--user {name}: {call}: {error}")]
    Change {
        name: String,
        call: &'static str,
        error: nix::Error,
    },
    #[error("--user {name}: root could be taken back; refusing to serve")]
    RootRegainable { name: String },
}

/// The user to become: `--user`'s, if given; started as root without it,
/// a refusal (`what` says why root will not do).
pub fn planned_user(user: Option<&str>, what: &str) -> Result<Option<User>, UserError> {
    match (user, Uid::effective().is_root()) {
        (None, true) => Err(UserError::RootWithoutUser {
            what: what.to_string(),
        }),
        (Some(name), _) => lookup_user(name).map(Some),
        (None, false) => Ok(None),
    }
}

/// `--user NAME` (or a uid): never root.
pub fn lookup_user(name: &str) -> Result<User, UserError> {
    let name_ = || name.to_string();
    let found = match name.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(name),
    };
    let user = match found {
        Ok(Some(u)) => u,
        Ok(None) => match name.parse::<u32>() {
            // A bare uid with no passwd entry (a container's): its own group.
            Ok(uid) => numeric_user(uid),
            Err(_) => return Err(UserError::NoSuchUser { name: name_() }),
        },
        Err(error) => {
            return Err(UserError::Lookup {
                name: name_(),
                error,
            })
        }
    };
    if user.uid.is_root() {
        return Err(UserError::IsRoot { name: name_() });
    }
    Ok(user)
}

fn numeric_user(uid: u32) -> User {
    User {
        name: uid.to_string(),
        passwd: Default::default(),
        uid: Uid::from_raw(uid),
        gid: Gid::from_raw(uid),
        gecos: Default::default(),
        dir: PathBuf::from("/"),
        shell: PathBuf::from("/bin/false"),
    }
}

/// Become `user` for good: no supplementary groups, all three gids and
/// uids its own (so root cannot be taken back).
pub fn become_user(user: &User) -> Result<(), UserError> {
    let name = || user.name.clone();
    if !Uid::effective().is_root() {
        return match Uid::effective() == user.uid {
            true => Ok(()),
            false => Err(UserError::NotRoot { name: name() }),
        };
    }
    let failed = |call: &'static str, error: nix::Error| UserError::Change {
        name: name(),
        call,
        error,
    };
    nix::unistd::setgroups(&[]).map_err(|e| failed("setgroups", e))?;
    nix::unistd::setresgid(user.gid, user.gid, user.gid).map_err(|e| failed("setresgid", e))?;
    nix::unistd::setresuid(user.uid, user.uid, user.uid).map_err(|e| failed("setresuid", e))?;
    match nix::unistd::setuid(Uid::from_raw(0)) {
        Err(_) => Ok(()),
        Ok(()) => Err(UserError::RootRegainable { name: name() }),
    }
}
