//! Serving as an unprivileged user: processes that parse bytes from the
//! network (`pycell mcp --http`, `pycell gateway`) may be started as root
//! (to bind a low port, read a key only root reads), then become `--user`
//! for good before they parse anything.

use std::path::PathBuf;

use nix::unistd::{Gid, Uid, User};

/// The user to become: `--user`'s, if given; started as root without it,
/// a refusal (`what` says why root will not do).
pub fn planned_user(user: Option<&str>, what: &str) -> Result<Option<User>, String> {
    match (user, Uid::effective().is_root()) {
        (None, true) => Err(format!("{what} and does not run as root: give --user NAME (it binds its address and reads its files as root, then serves as NAME), or start it as that user")),
        (Some(name), _) => lookup_user(name).map(Some),
        (None, false) => Ok(None),
    }
}

/// `--user NAME` (or a uid): never root.
pub fn lookup_user(name: &str) -> Result<User, String> {
    let found = match name.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(name),
    };
    let user = match found {
        Ok(Some(u)) => u,
        Ok(None) => match name.parse::<u32>() {
            // A bare uid with no passwd entry (a container's): its own group.
            Ok(uid) => numeric_user(uid),
            Err(_) => return Err(format!("--user {name}: no such user")),
        },
        Err(e) => return Err(format!("--user {name}: {e}")),
    };
    if user.uid.is_root() {
        return Err(format!(
            "--user {name}: that is root; name an unprivileged user"
        ));
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
pub fn become_user(user: &User) -> Result<(), String> {
    if !Uid::effective().is_root() {
        return match Uid::effective() == user.uid {
            true => Ok(()),
            false => Err(format!(
                "--user {}: only root can become another user",
                user.name
            )),
        };
    }
    let failed = |what: &str, e: nix::Error| format!("--user {}: {what}: {e}", user.name);
    nix::unistd::setgroups(&[]).map_err(|e| failed("setgroups", e))?;
    nix::unistd::setresgid(user.gid, user.gid, user.gid).map_err(|e| failed("setresgid", e))?;
    nix::unistd::setresuid(user.uid, user.uid, user.uid).map_err(|e| failed("setresuid", e))?;
    match nix::unistd::setuid(Uid::from_raw(0)) {
        Err(_) => Ok(()),
        Ok(()) => Err(format!(
            "--user {}: root could be taken back; refusing to serve",
            user.name
        )),
    }
}
