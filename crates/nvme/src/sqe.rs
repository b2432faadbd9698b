//! NVMe Base Specification 1.4 §4.2 (Submission Queue Entry, common command
//! format) and §4.4 (Scatter Gather Lists) as NVMe-oF 1.1 §2.3 and the TCP
//! transport binding (§7.3.2 of TP 8000) use them: the 64-byte SQE with its
//! SGL descriptor in DPTR.

/// Size of a submission queue entry.
pub const SQE_LEN: usize = 64;

/// A parse failure of an SQE or of its SGL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SqeError {
    /// Fewer than 64 bytes.
    #[error("SQE of {0} bytes, 64 needed")]
    Short(usize),
    /// PSDT is 00b (PRPs) or reserved: fabrics commands use SGLs.
    #[error("PSDT {0} is not an SGL")]
    NotSgl(u8),
    /// FUSE is the reserved value 11b.
    #[error("reserved FUSE value")]
    ReservedFuse,
    /// The SGL descriptor's type is not one the TCP transport accepts.
    #[error("SGL descriptor type {0:#04x} not supported")]
    SglType(u8),
}

/// Fused operation (CDW0 bits 9:8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fuse {
    /// Normal operation.
    Normal,
    /// First command of a fused pair.
    First,
    /// Second command of a fused pair.
    Second,
}

/// Direction of a command's data, from bits 1:0 of its opcode (or of a
/// fabrics command's FCTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataDirection {
    /// No data transfer.
    None,
    /// Host to controller (a write).
    HostToController,
    /// Controller to host (a read).
    ControllerToHost,
    /// Both directions.
    Bidirectional,
}

impl DataDirection {
    /// The direction bits 1:0 of an opcode name.
    pub fn of_opcode(opcode: u8) -> Self {
        match opcode & 3 {
            0 => Self::None,
            1 => Self::HostToController,
            2 => Self::ControllerToHost,
            _ => Self::Bidirectional,
        }
    }
}

/// The SGL descriptor in DPTR, as the TCP transport uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sgl {
    /// Data Block with Offset (type 0h, subtype 1h): in-capsule data
    /// starting `offset` bytes into the capsule's data.
    InCapsule {
        /// Offset into the in-capsule data.
        offset: u64,
        /// Bytes of data.
        len: u32,
    },
    /// Transport SGL Data Block (type 5h, subtype Ah): data moved by
    /// R2T/H2CData or C2HData PDUs.
    Transport {
        /// Bytes of data.
        len: u32,
    },
}

/// Descriptor type byte (identifier) of a Data Block with offset.
pub const SGL_DATA_BLOCK_OFFSET: u8 = 0x01;
/// Descriptor type byte of a Transport SGL Data Block, transport specific.
pub const SGL_TRANSPORT_DATA_BLOCK: u8 = 0x5A;

impl Sgl {
    /// Decodes a 16-byte SGL descriptor.
    pub fn parse(b: &[u8; 16]) -> Result<Self, SqeError> {
        let addr = u64::from_le_bytes(b[0..8].try_into().unwrap_or_default());
        let len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        match b[15] {
            SGL_DATA_BLOCK_OFFSET => Ok(Sgl::InCapsule { offset: addr, len }),
            SGL_TRANSPORT_DATA_BLOCK => Ok(Sgl::Transport { len }),
            t => Err(SqeError::SglType(t)),
        }
    }

    /// Encodes this descriptor into 16 bytes.
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        let (addr, len, id) = match *self {
            Sgl::InCapsule { offset, len } => (offset, len, SGL_DATA_BLOCK_OFFSET),
            Sgl::Transport { len } => (0, len, SGL_TRANSPORT_DATA_BLOCK),
        };
        b[0..8].copy_from_slice(&addr.to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[15] = id;
        b
    }

    /// Length of the data this descriptor describes.
    pub fn len(&self) -> u32 {
        match *self {
            Sgl::InCapsule { len, .. } | Sgl::Transport { len } => len,
        }
    }

    /// Whether the descriptor describes no data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A 64-byte submission queue entry, kept as its bytes with typed accessors.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sqe(pub [u8; SQE_LEN]);

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &self.opcode())
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .field("cdw10", &self.cdw(10))
            .finish_non_exhaustive()
    }
}

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0; SQE_LEN])
    }
}

impl Sqe {
    /// The SQE in the first 64 bytes of `b`.
    pub fn parse(b: &[u8]) -> Result<Self, SqeError> {
        let bytes: [u8; SQE_LEN] = b
            .get(..SQE_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(SqeError::Short(b.len()))?;
        Ok(Sqe(bytes))
    }

    /// A zeroed SQE with this opcode and command identifier, PSDT = SGL.
    pub fn new(opcode: u8, cid: u16) -> Self {
        let mut s = Sqe::default();
        s.0[0] = opcode;
        s.0[1] = 1 << 6;
        s.0[2..4].copy_from_slice(&cid.to_le_bytes());
        s
    }

    /// Opcode (CDW0 bits 7:0).
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    /// Fused operation bits; the reserved value is an error.
    pub fn fuse(&self) -> Result<Fuse, SqeError> {
        match self.0[1] & 3 {
            0 => Ok(Fuse::Normal),
            1 => Ok(Fuse::First),
            2 => Ok(Fuse::Second),
            _ => Err(SqeError::ReservedFuse),
        }
    }

    /// PRP or SGL for Data Transfer (CDW0 bits 15:14).
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }

    /// Command Identifier.
    pub fn cid(&self) -> u16 {
        u16::from_le_bytes([self.0[2], self.0[3]])
    }

    /// Namespace Identifier (for a fabrics command these bytes hold FCTYPE).
    pub fn nsid(&self) -> u32 {
        self.dword_at(4)
    }

    /// Command dword `n` (0..=15).
    pub fn cdw(&self, n: usize) -> u32 {
        self.dword_at((n % 16) * 4)
    }

    /// Sets command dword `n` (0..=15).
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        let at = (n % 16) * 4;
        self.0[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// Sets the namespace identifier.
    pub fn set_nsid(&mut self, nsid: u32) {
        self.set_cdw(1, nsid);
    }

    /// Sets the fused operation bits.
    pub fn set_fuse(&mut self, fuse: Fuse) {
        let v = match fuse {
            Fuse::Normal => 0,
            Fuse::First => 1,
            Fuse::Second => 2,
        };
        self.0[1] = self.0[1] & !3 | v;
    }

    /// Fabrics Command Type (byte 4) of an opcode 7Fh command.
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// The SGL descriptor in DPTR (bytes 24..40); PSDT must name an SGL.
    pub fn sgl(&self) -> Result<Sgl, SqeError> {
        match self.psdt() {
            1 | 2 => {}
            p => return Err(SqeError::NotSgl(p)),
        }
        let mut d = [0u8; 16];
        d.copy_from_slice(&self.0[24..40]);
        Sgl::parse(&d)
    }

    /// Writes `sgl` into DPTR and sets PSDT to SGL.
    pub fn set_sgl(&mut self, sgl: Sgl) {
        self.0[1] = self.0[1] & 0x3F | 1 << 6;
        self.0[24..40].copy_from_slice(&sgl.encode());
    }

    /// The direction of this command's data: from the FCTYPE of a fabrics
    /// command, from the opcode otherwise.
    pub fn direction(&self) -> DataDirection {
        if self.opcode() == crate::sqe::FABRICS_OPCODE {
            DataDirection::of_opcode(self.fctype())
        } else {
            DataDirection::of_opcode(self.opcode())
        }
    }

    fn dword_at(&self, at: usize) -> u32 {
        let b = &self.0[at..at + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// Opcode of every fabrics command (NVMe-oF 1.1 §6).
pub const FABRICS_OPCODE: u8 = 0x7F;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let mut raw = [0u8; 64];
        raw[0] = 0x01; // write
        raw[1] = 0x41; // PSDT 01b, FUSE first
        raw[2..4].copy_from_slice(&0x1234u16.to_le_bytes());
        raw[4..8].copy_from_slice(&7u32.to_le_bytes());
        raw[32..36].copy_from_slice(&4096u32.to_le_bytes());
        raw[39] = 0x5A;
        raw[40..44].copy_from_slice(&0xAABB_CCDDu32.to_le_bytes());
        raw[60..64].copy_from_slice(&5u32.to_le_bytes());
        let s = Sqe::parse(&raw).unwrap();
        assert_eq!(s.opcode(), 1);
        assert_eq!(s.fuse(), Ok(Fuse::First));
        assert_eq!(s.psdt(), 1);
        assert_eq!(s.cid(), 0x1234);
        assert_eq!(s.nsid(), 7);
        assert_eq!(s.cdw(10), 0xAABB_CCDD);
        assert_eq!(s.cdw(15), 5);
        assert_eq!(s.sgl(), Ok(Sgl::Transport { len: 4096 }));
        assert_eq!(s.direction(), DataDirection::HostToController);
    }

    #[test]
    fn in_capsule_sgl_and_errors() {
        let mut s = Sqe::new(0x02, 9);
        s.set_sgl(Sgl::InCapsule {
            offset: 0,
            len: 512,
        });
        assert_eq!(s.0[39], 0x01);
        assert_eq!(
            s.sgl(),
            Ok(Sgl::InCapsule {
                offset: 0,
                len: 512
            })
        );
        s.0[39] = 0x40; // keyed data block: not for TCP
        assert_eq!(s.sgl(), Err(SqeError::SglType(0x40)));
        s.0[1] = 0; // PRP
        assert_eq!(s.sgl(), Err(SqeError::NotSgl(0)));
        s.0[1] = 3;
        assert_eq!(s.fuse(), Err(SqeError::ReservedFuse));
        assert_eq!(Sqe::parse(&[0; 63]), Err(SqeError::Short(63)));
    }

    #[test]
    fn fabrics_direction_from_fctype() {
        let mut s = Sqe::new(FABRICS_OPCODE, 1);
        s.0[4] = 0x01; // Connect: host to controller
        assert_eq!(s.direction(), DataDirection::HostToController);
        s.0[4] = 0x04; // Property Get: none
        assert_eq!(s.direction(), DataDirection::None);
    }
}
