//! Descriptors that travel with a message, each named in it: the sender
//! lists a name for every descriptor it attaches, in the order they go;
//! the receiver pairs the names with what came and takes each by name,
//! never by position. A message with a new kind of descriptor is one more
//! name, not one more place in a fixed order (as [`crate::handout`] does
//! for the descriptors a jail hands out).

use std::fmt::Debug;

/// Split `(name, descriptor)` pairs into the names (for the message) and
/// the descriptors (to attach), in one order.
pub fn split<K, F>(named: Vec<(K, F)>) -> (Vec<K>, Vec<F>) {
    named.into_iter().unzip()
}

/// What is wrong with the descriptors that came with a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamedFdsError {
    #[error("the message names {names} descriptors but {came} came with it")]
    Count { names: usize, came: usize },
    #[error("no {0} descriptor came with the message")]
    Missing(String),
    #[error("an unexpected {0} descriptor")]
    Unexpected(String),
}

/// Descriptors that came with a message, paired with the names it gave.
#[derive(Debug)]
pub struct Named<K, F> {
    items: Vec<(K, F)>,
}

impl<K: PartialEq + Debug, F> Named<K, F> {
    /// Pair `names` (from the message) with `fds` (what came with it);
    /// refused unless there is exactly one name for each.
    pub fn pair(names: Vec<K>, fds: Vec<F>) -> Result<Named<K, F>, NamedFdsError> {
        if names.len() != fds.len() {
            return Err(NamedFdsError::Count {
                names: names.len(),
                came: fds.len(),
            });
        }
        Ok(Named {
            items: names.into_iter().zip(fds).collect(),
        })
    }

    /// The descriptor named `name`, if one came (the first, if several).
    pub fn take(&mut self, name: &K) -> Option<F> {
        let at = self.items.iter().position(|(k, _)| k == name)?;
        Some(self.items.remove(at).1)
    }

    /// The descriptor named `name`, or what is missing.
    pub fn one(&mut self, name: &K) -> Result<F, NamedFdsError> {
        self.take(name)
            .ok_or_else(|| NamedFdsError::Missing(format!("{name:?}")))
    }

    /// Every descriptor named `name`, in the order they came.
    pub fn all(&mut self, name: &K) -> Vec<F> {
        let (taken, rest) = std::mem::take(&mut self.items)
            .into_iter()
            .partition(|(k, _)| k == name);
        self.items = rest;
        taken.into_iter().map(|(_, f)| f).collect()
    }

    /// Refused if any descriptor was not taken (a name the receiver does
    /// not expect): it is closed, and the message is wrong.
    pub fn done(self) -> Result<(), NamedFdsError> {
        match self.items.first() {
            None => Ok(()),
            Some((name, _)) => Err(NamedFdsError::Unexpected(format!("{name:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Clone, Copy)]
    enum Kind {
        Events,
        Stdin,
        Grant(usize),
    }

    #[test]
    fn descriptors_are_taken_by_name_whatever_their_order() {
        let (names, fds) = split(vec![(Kind::Stdin, "s"), (Kind::Events, "e")]);
        let mut got = Named::pair(names, fds).unwrap();
        assert_eq!(got.one(&Kind::Events).unwrap(), "e");
        assert_eq!(got.take(&Kind::Stdin), Some("s"));
        assert_eq!(got.take(&Kind::Stdin), None);
        got.done().unwrap();
    }

    #[test]
    fn a_count_that_differs_from_the_names_is_refused() {
        let e = Named::pair(vec![Kind::Events], vec!["e", "x"]).unwrap_err();
        assert_eq!(e, NamedFdsError::Count { names: 1, came: 2 });
        assert!(e.to_string().contains("names 1 descriptors but 2"), "{e}");
        assert!(Named::<Kind, &str>::pair(vec![Kind::Events], vec![]).is_err());
    }

    #[test]
    fn a_missing_or_unexpected_name_is_said() {
        let mut got = Named::pair(vec![Kind::Grant(1)], vec!["g"]).unwrap();
        let e = got.one(&Kind::Grant(0)).unwrap_err();
        assert_eq!(e, NamedFdsError::Missing("Grant(0)".into()));
        let e = got.done().unwrap_err();
        assert_eq!(e.to_string(), "an unexpected Grant(1) descriptor");
    }

    #[test]
    fn all_takes_every_one_of_a_name_in_order() {
        let names = vec![Kind::Events, Kind::Grant(0), Kind::Events];
        let mut got = Named::pair(names, vec![1, 2, 3]).unwrap();
        assert_eq!(got.all(&Kind::Events), vec![1, 3]);
        assert_eq!(got.one(&Kind::Grant(0)).unwrap(), 2);
        got.done().unwrap();
    }
}
