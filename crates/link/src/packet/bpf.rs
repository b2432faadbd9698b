//! The classic BPF receive filter (`SO_ATTACH_FILTER`) of an AF_PACKET
//! link: in the kernel, before a frame reaches the ring, it drops our own
//! outgoing frames, other EtherTypes (already excluded by the socket's
//! protocol, kept as a second check) and destinations other than our MAC,
//! broadcast and, if asked, multicast. Loads are big-endian (network
//! order), as classic BPF defines them.

use libc::sock_filter;

use crate::frame::RxFilter;

/// The kernel's `SKF_AD_OFF + SKF_AD_PKTTYPE`: load `skb->pkt_type`.
const LOAD_PKTTYPE: u32 = (libc::SKF_AD_OFF + libc::SKF_AD_PKTTYPE) as u32;
/// Return value that accepts the whole frame.
const ACCEPT: u32 = u32::MAX;

const fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump(code: u32, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The kernel's `SKF_LL_OFF`: loads at this offset and beyond read the
/// link-layer (Ethernet) header, wherever the frame's data starts (a
/// fanout program sees the frame from its network header on).
const LINK_LAYER: u32 = libc::SKF_LL_OFF as u32;

/// The fanout program of [`FanoutMode::SourceMac`](super::FanoutMode):
/// returns a hash of the source MAC (the kernel takes it modulo the
/// group's sockets). Every frame of one sender gets the same value; the
/// multiplications mix every bit of the address into the low bits the
/// modulo keeps (MACs that differ only in a few bits, as a vendor's or
/// a test's usually do, still spread).
pub(super) fn source_mac_hash() -> Vec<sock_filter> {
    use libc::{BPF_A, BPF_TAX, BPF_W, BPF_X, BPF_XOR};
    use libc::{BPF_ABS, BPF_ALU, BPF_H, BPF_K, BPF_LD, BPF_MISC, BPF_MUL, BPF_RET, BPF_RSH};
    vec![
        // X = source MAC bytes 2..6 (bytes 8..12 of the frame).
        stmt(BPF_LD | BPF_W | BPF_ABS, LINK_LAYER.wrapping_add(8)),
        stmt(BPF_MISC | BPF_TAX, 0),
        // A = (bytes 0..2 * K1) ^ X.
        stmt(BPF_LD | BPF_H | BPF_ABS, LINK_LAYER.wrapping_add(6)),
        stmt(BPF_ALU | BPF_MUL | BPF_K, 0x9e37_79b1),
        stmt(BPF_ALU | BPF_XOR | BPF_X, 0),
        // A ^= A >> 16: the high half reaches the low bits.
        stmt(BPF_MISC | BPF_TAX, 0),
        stmt(BPF_ALU | BPF_RSH | BPF_K, 16),
        stmt(BPF_ALU | BPF_XOR | BPF_X, 0),
        // (A * K2) >> 16: bits 16.. of the product depend on all 16
        // low bits of A.
        stmt(BPF_ALU | BPF_MUL | BPF_K, 0x85eb_ca6b),
        stmt(BPF_ALU | BPF_RSH | BPF_K, 16),
        stmt(BPF_RET | BPF_A, 0),
    ]
}

/// A program that accepts nothing: a fanout member's filter until it has
/// joined its group (a bound socket receives on its own until then, so
/// a frame would reach it and the group both).
pub(super) fn drop_all() -> Vec<sock_filter> {
    vec![stmt(libc::BPF_RET | libc::BPF_K, 0)]
}

/// The filter program for `filter`. Jump offsets count instructions after
/// the jump; the last two instructions are "accept" and "drop".
pub(super) fn program(filter: &RxFilter) -> Vec<sock_filter> {
    use libc::{BPF_ABS, BPF_B, BPF_H, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let m = filter.mac.0;
    let mac_hi = u32::from_be_bytes([m[0], m[1], m[2], m[3]]);
    let mac_lo = u32::from(u16::from_be_bytes([m[4], m[5]]));
    let mut p = vec![
        /* 0 */ stmt(BPF_LD | BPF_W | BPF_ABS, LOAD_PKTTYPE),
        /* 1 */
        jump(
            BPF_JMP | BPF_JEQ | BPF_K,
            u32::from(libc::PACKET_OUTGOING),
            0,
            0,
        ), // → drop
        /* 2 */ stmt(BPF_LD | BPF_H | BPF_ABS, 12),
        /* 3 */
        jump(BPF_JMP | BPF_JEQ | BPF_K, u32::from(filter.ethertype), 0, 0), // else → drop
        /* 4 */ stmt(BPF_LD | BPF_B | BPF_ABS, 0),
        /* 5 */ jump(BPF_JMP | BPF_JSET | BPF_K, 1, 4, 0), // group bit → 10
        /* 6 */ stmt(BPF_LD | BPF_W | BPF_ABS, 0),
        /* 7 */ jump(BPF_JMP | BPF_JEQ | BPF_K, mac_hi, 0, 0), // else → drop
        /* 8 */ stmt(BPF_LD | BPF_H | BPF_ABS, 4),
        /* 9 */ jump(BPF_JMP | BPF_JEQ | BPF_K, mac_lo, 0, 0), // → accept / drop
    ];
    if filter.multicast {
        // 10: any group address passes.
        p.push(stmt(BPF_RET | BPF_K, ACCEPT));
    } else {
        // 10..=13: only ff:ff:ff:ff:ff:ff.
        p.push(stmt(BPF_LD | BPF_W | BPF_ABS, 0));
        p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, u32::MAX, 0, 0));
        p.push(stmt(BPF_LD | BPF_H | BPF_ABS, 4));
        p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, 0xffff, 0, 0));
    }
    let accept = p.len();
    p.push(stmt(BPF_RET | BPF_K, ACCEPT));
    let drop = p.len();
    p.push(stmt(BPF_RET | BPF_K, 0));
    // Fill in the forward jumps to "accept" and "drop".
    let rel = |from: usize, to: usize| (to - from - 1) as u8;
    p[1].jt = rel(1, drop);
    p[3].jf = rel(3, drop);
    p[7].jf = rel(7, drop);
    p[9].jt = rel(9, accept);
    p[9].jf = rel(9, drop);
    if !filter.multicast {
        p[11].jf = rel(11, drop);
        p[13].jt = rel(13, accept);
        p[13].jf = rel(13, drop);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EthernetHeader, MacAddr, ETHERTYPE_AOE};

    /// Runs the subset of classic BPF that [`program`] and
    /// [`source_mac_hash`] use (loads past [`LINK_LAYER`] read the frame).
    fn run(prog: &[sock_filter], frame: &[u8], pkttype: u8) -> u32 {
        let (mut a, mut x): (u32, u32) = (0, 0);
        let mut pc = 0;
        loop {
            let i = prog[pc];
            let code = u32::from(i.code);
            pc += 1;
            let load = |k: u32, width: usize| -> Option<u32> {
                let at = if k >= LINK_LAYER { k - LINK_LAYER } else { k } as usize;
                let b = frame.get(at..at + width)?;
                Some(b.iter().fold(0u32, |acc, &x| acc << 8 | u32::from(x)))
            };
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS && i.k == LOAD_PKTTYPE => {
                    a = u32::from(pkttype)
                }
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => match load(i.k, 4) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == libc::BPF_LD | libc::BPF_H | libc::BPF_ABS => match load(i.k, 2) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == libc::BPF_LD | libc::BPF_B | libc::BPF_ABS => match load(i.k, 1) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += usize::from(if a == i.k { i.jt } else { i.jf })
                }
                c if c == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K => {
                    pc += usize::from(if a & i.k != 0 { i.jt } else { i.jf })
                }
                c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                c if c == libc::BPF_RET | libc::BPF_A => return a,
                c if c == libc::BPF_MISC | libc::BPF_TAX => x = a,
                c if c == libc::BPF_ALU | libc::BPF_MUL | libc::BPF_K => a = a.wrapping_mul(i.k),
                c if c == libc::BPF_ALU | libc::BPF_RSH | libc::BPF_K => a >>= i.k,
                c if c == libc::BPF_ALU | libc::BPF_XOR | libc::BPF_X => a ^= x,
                _ => panic!("unexpected instruction {i:?}"),
            }
        }
    }

    #[test]
    fn program_matches_the_user_space_filter() {
        let me = MacAddr([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
        let near = [
            MacAddr([0x02, 0x11, 0x22, 0x33, 0x44, 0x56]),
            MacAddr([0x02, 0x11, 0x22, 0x34, 0x44, 0x55]),
            MacAddr([0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]),
            MacAddr([0x01, 0x00, 0x5e, 0x00, 0x00, 0x01]),
            MacAddr([0x33, 0x33, 0x00, 0x00, 0x00, 0x01]),
            me,
            MacAddr::BROADCAST,
        ];
        for multicast in [false, true] {
            let filter = RxFilter {
                mac: me,
                ethertype: ETHERTYPE_AOE,
                multicast,
            };
            let prog = program(&filter);
            for dst in near {
                for ethertype in [ETHERTYPE_AOE, 0x0800, 0x88a3] {
                    let mut frame = EthernetHeader {
                        dst,
                        src: me,
                        ethertype,
                    }
                    .to_bytes()
                    .to_vec();
                    frame.resize(60, 0);
                    for pkttype in [
                        libc::PACKET_HOST,
                        libc::PACKET_BROADCAST,
                        libc::PACKET_OTHERHOST,
                    ] {
                        let want = filter.accepts(&frame);
                        assert_eq!(
                            run(&prog, &frame, pkttype) != 0,
                            want,
                            "{dst} {ethertype:#x} {multicast}"
                        );
                    }
                    assert_eq!(run(&prog, &frame, libc::PACKET_OUTGOING), 0);
                }
            }
            assert_eq!(run(&prog, &[0xff; 10], libc::PACKET_HOST), 0);
        }
    }

    /// The source-MAC hash spreads senders whose addresses differ in a
    /// few bits over two and over three sockets, and ignores the rest of
    /// the frame.
    #[test]
    fn source_mac_hash_spreads_close_addresses() {
        let prog = source_mac_hash();
        let hash = |src: MacAddr, ethertype: u16, fill: u8| {
            let mut frame = EthernetHeader {
                dst: MacAddr::BROADCAST,
                src,
                ethertype,
            }
            .to_bytes()
            .to_vec();
            frame.resize(64, fill);
            run(&prog, &frame, libc::PACKET_HOST)
        };
        // Sequential addresses, and addresses with only even low bytes.
        let families: [Box<dyn Fn(u8) -> MacAddr>; 3] = [
            Box::new(|i| MacAddr([0x02, 0, 0x5e, 0x10, i.wrapping_mul(37), i])),
            Box::new(|i| MacAddr([0x02, 0, 0, 0, 0, i])),
            Box::new(|i| MacAddr([0x02, 0, 0, 0, 0, i.wrapping_mul(2)])),
        ];
        for family in &families {
            for n in [2u32, 3] {
                let mut per = vec![0; n as usize];
                for i in 0..16u8 {
                    let h = hash(family(i), ETHERTYPE_AOE, 0);
                    assert_eq!(
                        h,
                        hash(family(i), 0x88b5, 0xaa),
                        "the hash saw more than the MAC"
                    );
                    per[(h % n) as usize] += 1;
                }
                assert!(per.iter().all(|&c| c >= 2), "{n} sockets: {per:?}");
            }
        }
    }
}
