//! STUB
#![allow(missing_docs)]
use crate::{aead::TrafficKeys, group::GroupKeys, Level};
use std::time::{Duration, Instant};
#[derive(Debug)]
pub struct Established {
    pub level: Level,
    pub local_id: u32,
    pub peer_id: u32,
    pub keys: TrafficKeys,
    pub peer_max_frame: u32,
}
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("x")]
    X,
}
#[derive(Debug)]
pub struct InitiatorHandshake;
impl InitiatorHandshake {
    pub fn new(
        _k: &GroupKeys,
        _id: u32,
        _l: Level,
        _mf: u32,
    ) -> Result<InitiatorHandshake, HandshakeError> {
        todo!()
    }
    pub fn hello(&self) -> &[u8] {
        todo!()
    }
    pub fn handle_reply(&mut self, _f: &[u8]) -> Result<(Vec<u8>, Established), HandshakeError> {
        todo!()
    }
}
#[derive(Debug)]
pub struct HelloOutcome {
    pub reply: Vec<u8>,
    pub repeated: bool,
}
#[derive(Debug)]
pub struct Responder;
impl Responder {
    pub fn new(_k: GroupKeys, _m: usize, _t: Duration) -> Responder {
        todo!()
    }
    pub fn handle_hello(
        &mut self,
        _now: Instant,
        _f: &[u8],
        _id: u32,
        _mf: u32,
    ) -> Result<HelloOutcome, HandshakeError> {
        todo!()
    }
    pub fn handle_finish(
        &mut self,
        _now: Instant,
        _f: &[u8],
    ) -> Result<Established, HandshakeError> {
        todo!()
    }
    pub fn expire(&mut self, _now: Instant) {
        todo!()
    }
}
