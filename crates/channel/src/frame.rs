//! STUB (replaced by the real codec on merge).
#![allow(missing_docs)]
pub const MAGIC: u8 = 0xE5;
pub const VERSION: u8 = 1;
pub const PREFIX_LEN: usize = 8;
pub const HEADER_LEN: usize = 40;
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Data = 1,
    Ack = 2,
    Close = 3,
    Hello = 0x10,
    HelloReply = 0x11,
    HelloFinish = 0x12,
    Discover = 0x20,
    DiscoverReply = 0x21,
}
#[derive(Debug, Clone, Copy)]
pub struct Prefix {
    pub kind: Kind,
    pub flags: u8,
    pub dst: u32,
}
impl Prefix {
    pub fn parse(_b: &[u8]) -> Result<Prefix, FrameError> {
        todo!()
    }
}
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("x")]
    Truncated,
}
