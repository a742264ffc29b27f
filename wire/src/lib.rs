//! What crosses `pycell-jailer`'s pipes, and nothing else: the resolved
//! jail spec it reads ([`spec`]), the report it ends with ([`report`]) and
//! its stable failure [`codes`], its event frames ([`events`]), the bounded
//! JSON frames its stdin carries ([`framing`]), the descriptors the jail
//! hands out, each named ([`handout`]), the jailer fork server's messages
//! ([`fork_server`]), descriptor passing over unix
//! sockets ([`fdpass`]) with each descriptor named by its message
//! ([`named_fds`]), and the marks of where a run spent its
//! time ([`timings`]).
//!
//! Threat model: the jailer (root) and every launcher link this crate. A
//! spec comes from pycell's own launcher, but is validated again by the
//! jailer before any of it is used; every frame's length is checked before
//! anything is allocated for it; the event stream carries the sandbox's
//! output, so a reader treats it as hostile bytes. No tokio, no policy
//! parsing, no `unsafe`.
#![forbid(unsafe_code)]

pub mod codes;
pub mod events;
pub mod fdpass;
pub mod fork_server;
pub mod framing;
pub mod handout;
pub mod limits;
pub mod named_fds;
pub mod outcome;
pub mod report;
pub mod spec;
pub mod timings;
