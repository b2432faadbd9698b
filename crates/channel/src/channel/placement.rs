//! Where placed data lands (docs/native-transport.md, "Placed data").

use std::mem::MaybeUninit;

/// Where placed data lands: what [`Channel::handle_frame_placing`](super::Channel::handle_frame_placing) asks
/// for the destination of each placed frame (the endpoint's table of
/// registered buffers; tests' own).
pub trait Placement {
    /// The `len` bytes at `offset` of the buffer registered under `tag`;
    /// `None` when there is no such registration or the range is beyond
    /// its buffer (the frame is then dropped and counted).
    fn slot(&mut self, tag: u32, offset: u64, len: usize) -> Option<PlaceSlot<'_>>;
    /// The bytes handed out by [`Placement::slot`] for `(tag, offset,
    /// len)` hold verified data now.
    ///
    /// # Safety
    ///
    /// Every one of those `len` bytes has been written (since the slot was
    /// handed out) with the frame's verified payload: an implementation may
    /// from now on read them as initialised `u8`s (hand the buffer out as a
    /// `Vec<u8>` once its whole length has landed).
    unsafe fn landed(&mut self, tag: u32, offset: u64, len: usize);
}

/// A destination for a placed frame's payload.
#[derive(Debug)]
pub struct PlaceSlot<'a> {
    /// Exactly the frame's payload length; possibly not initialised (a
    /// read buffer is never zeroed): the channel writes it with
    /// `MaybeUninit` copies and views it as bytes only once written.
    pub dst: &'a mut [MaybeUninit<u8>],
    /// No byte of `dst` has landed yet: the frame may be verified straight
    /// into it (a forged frame leaves garbage only where nothing has
    /// landed, and those bytes are not reported as landed). Otherwise it
    /// is verified in place first, then copied.
    pub fresh: bool,
}

/// No buffer registered: every placed frame is dropped (and counted).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPlacement;

impl Placement for NoPlacement {
    fn slot(&mut self, _tag: u32, _offset: u64, _len: usize) -> Option<PlaceSlot<'_>> {
        None
    }
    unsafe fn landed(&mut self, _tag: u32, _offset: u64, _len: usize) {}
}
