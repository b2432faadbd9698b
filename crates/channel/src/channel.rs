//! STUB
#![allow(missing_docs)]
use crate::frame::FrameError;
use std::time::{Duration, Instant};
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    pub max_frame: usize,
    pub initial_cwnd: u32,
    pub max_cwnd: u32,
    pub recv_window: u32,
    pub initial_rto: Duration,
    pub min_rto: Duration,
    pub max_rto: Duration,
    pub ack_delay: Duration,
    pub ack_every: u32,
    pub dead_after: Duration,
    pub max_message: usize,
}
impl Default for ChannelConfig {
    fn default() -> Self {
        todo!()
    }
}
#[derive(Debug)]
pub struct Channel;
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("x")]
    Closed,
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelState {
    Open,
    Closing,
    Closed,
    Failed(String),
}
#[derive(Debug, Clone, Default)]
pub struct ChannelStats {
    pub cwnd: u32,
    pub peer_credit: u32,
    pub srtt: Duration,
    pub rttvar: Duration,
    pub rto: Duration,
    pub frames_sent: u64,
    pub frames_received: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub retransmits: u64,
    pub fast_retransmits: u64,
    pub timeouts: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    pub rejected: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
}
impl Channel {
    pub fn new(
        _cfg: ChannelConfig,
        _l: u32,
        _p: u32,
        _pr: crate::protect::Protector,
        _now: Instant,
    ) -> Channel {
        todo!()
    }
    pub fn send_message(&mut self, _m: &[u8]) -> Result<(), ChannelError> {
        todo!()
    }
    pub fn send_buffered(&self) -> usize {
        todo!()
    }
    pub fn handle_frame(&mut self, _now: Instant, _f: &mut [u8]) -> Result<(), FrameError> {
        todo!()
    }
    pub fn poll_transmit(&mut self, _now: Instant, _out: &mut Vec<u8>) -> bool {
        todo!()
    }
    pub fn recv_message(&mut self) -> Option<Vec<u8>> {
        todo!()
    }
    pub fn poll_timeout(&self) -> Option<Instant> {
        todo!()
    }
    pub fn handle_timeout(&mut self, _now: Instant) {
        todo!()
    }
    pub fn close(&mut self) {
        todo!()
    }
    pub fn state(&self) -> ChannelState {
        todo!()
    }
    pub fn stats(&self) -> ChannelStats {
        todo!()
    }
    pub fn local_id(&self) -> u32 {
        todo!()
    }
    pub fn peer_id(&self) -> u32 {
        todo!()
    }
    pub fn level(&self) -> crate::Level {
        todo!()
    }
}
