//! What size each I/O of `bench` is ([`SizeMix`], `--bs`) and where it
//! goes ([`Offsets`], `--random-pct`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::cp::parse_bytes;

/// The size of each I/O: one size, or sizes with relative weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SizeMix {
    /// (bytes, weight), weights > 0, in the order given.
    items: Vec<(u64, u64)>,
    /// The sum of the weights.
    total: u64,
}

impl SizeMix {
    pub(super) fn sizes(&self) -> impl Iterator<Item = u64> + '_ {
        self.items.iter().map(|&(s, _)| s)
    }

    pub(super) fn max(&self) -> u64 {
        self.sizes().max().unwrap_or(0)
    }

    /// The one size when this is not a mix.
    pub(super) fn single(&self) -> Option<u64> {
        match self.items.as_slice() {
            [(s, _)] => Some(*s),
            _ => None,
        }
    }

    /// A size drawn with the weights' probabilities.
    pub(super) fn draw(&self, rng: &mut fastrand::Rng) -> u64 {
        if let Some(s) = self.single() {
            return s;
        }
        let mut x = rng.u64(0..self.total);
        for &(size, weight) in &self.items {
            if x < weight {
                return size;
            }
            x -= weight;
        }
        unreachable!("x < total")
    }

    /// As given on the command line, in the K/M form.
    pub(super) fn text(&self) -> String {
        match self.single() {
            Some(s) => size_text(s),
            None => self
                .items
                .iter()
                .map(|&(s, w)| format!("{}:{w}", size_text(s)))
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

const MIX_FORM: &str =
    "expected SIZE or SIZE:WEIGHT,SIZE:WEIGHT,... (e.g. 4K or 512:10,4K:60,64K:30; weights are whole numbers > 0)";

/// `--bs`: one size (`4K`), or a comma list of SIZE:WEIGHT.
pub(crate) fn parse_mix(s: &str) -> Result<SizeMix, String> {
    let s = s.trim();
    if !s.contains([',', ':']) {
        let size = parse_bytes(s).map_err(|e| format!("{e}; {MIX_FORM}"))?;
        if size == 0 {
            return Err(format!("an I/O size must be more than 0; {MIX_FORM}"));
        }
        return Ok(SizeMix {
            items: vec![(size, 1)],
            total: 1,
        });
    }
    let mut items = Vec::new();
    for item in s.split(',') {
        let bad = |why: &str| format!("bad item {:?} in the mix ({why}): {MIX_FORM}", item.trim());
        let Some((size, weight)) = item.split_once(':') else {
            return Err(bad("no :WEIGHT"));
        };
        let size = parse_bytes(size.trim()).map_err(|e| bad(&e))?;
        if size == 0 {
            return Err(bad("a size of 0"));
        }
        let weight: u64 = weight
            .trim()
            .parse()
            .map_err(|_| bad("the weight is not a whole number"))?;
        if weight == 0 {
            return Err(bad("a weight of 0"));
        }
        if weight > u64::from(u32::MAX) {
            return Err(bad("the weight is too large"));
        }
        items.push((size, weight));
    }
    let total = items.iter().map(|&(_, w)| w).sum();
    Ok(SizeMix { items, total })
}

/// The alignment of an I/O's offset: its size, at most 4 KiB, and at least
/// the block size (so that O_DIRECT works for sizes of 4 KiB and more).
pub(super) fn alignment(size: u64, block: u64) -> u64 {
    size.min(4096).max(block)
}

/// Where each I/O goes: at random with probability `random_pct`%, else
/// right after the previous I/O (of any worker: one stream, as Iometer's
/// worker with many I/Os outstanding), wrapping at `span`.
pub(super) struct Offsets {
    span: u64,
    random_pct: u8,
    /// The end of the previous I/O.
    cursor: AtomicU64,
}

impl Offsets {
    pub(super) fn new(span: u64, random_pct: u8) -> Offsets {
        Offsets {
            span,
            random_pct,
            cursor: AtomicU64::new(0),
        }
    }

    /// The offset of an I/O of `size` bytes (at most `span`), a multiple of
    /// `align`.
    pub(super) fn next(&self, rng: &mut fastrand::Rng, size: u64, align: u64) -> u64 {
        let random = match self.random_pct {
            0 => false,
            100.. => true,
            p => rng.u8(0..100) < p,
        };
        if random {
            let off = rng.u64(0..=(self.span - size) / align) * align;
            self.cursor.store(off + size, Ordering::Relaxed);
            return off;
        }
        let mut off = 0;
        self.cursor
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |end| {
                off = end.next_multiple_of(align);
                if off + size > self.span {
                    off = 0;
                }
                Some(off + size)
            })
            .expect("the closure always updates");
        off
    }
}

/// A size in the K/M form the options take.
pub(super) fn size_text(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else if bytes.is_multiple_of(1024) {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_size_or_a_weighted_mix() {
        assert_eq!(parse_mix("4K").unwrap().single(), Some(4096));
        let m = parse_mix("512:10, 1K:5,64K:10").unwrap();
        assert_eq!(m.items, vec![(512, 10), (1024, 5), (65536, 10)]);
        assert_eq!(m.total, 25);
        assert_eq!(m.max(), 65536);
        assert_eq!(m.single(), None);
        assert_eq!(m.text(), "512:10,1K:5,64K:10");
        // A one-item mix is one size.
        assert_eq!(parse_mix("8K:3").unwrap().single(), Some(8192));
    }

    #[test]
    fn a_malformed_mix_names_the_bad_item_and_the_form() {
        for (bad, item) in [
            ("512:10,4K", "\"4K\""),
            ("512:10,4K:0", "\"4K:0\""),
            ("512:10,4K:x", "\"4K:x\""),
            ("512:10,zz:3", "\"zz:3\""),
            ("0:1,4K:1", "\"0:1\""),
            ("4K:-1", "\"4K:-1\""),
            ("4K:1,", "\"\""),
        ] {
            let e = parse_mix(bad).unwrap_err();
            assert!(e.contains(item), "{bad}: {e}");
            assert!(e.contains("SIZE:WEIGHT"), "{bad}: {e}");
        }
        assert!(parse_mix("0").unwrap_err().contains("SIZE:WEIGHT"));
    }

    #[test]
    fn sizes_are_drawn_with_the_weights() {
        let m = parse_mix("512:10,1K:5,2K:5,4K:60,8K:2,16K:4,32K:4,64K:10").unwrap();
        let mut rng = fastrand::Rng::with_seed(7);
        let n = 200_000;
        let mut counts = std::collections::HashMap::new();
        for _ in 0..n {
            *counts.entry(m.draw(&mut rng)).or_insert(0u64) += 1;
        }
        for &(size, weight) in &m.items {
            let got = counts[&size] as f64 / n as f64;
            let want = weight as f64 / m.total as f64;
            assert!((got - want).abs() < 0.005, "{size}: {got} vs {want}");
        }
        assert_eq!(counts.len(), m.items.len());
    }

    #[test]
    fn random_pct_0_is_strictly_sequential_with_aligned_wrapping() {
        let span = 1 << 20;
        let o = Offsets::new(span, 0);
        let m = parse_mix("512:1,4K:1,8K:1,64K:1").unwrap();
        let mut rng = fastrand::Rng::with_seed(1);
        let mut end = 0u64;
        let mut wrapped = 0;
        for _ in 0..10_000 {
            let size = m.draw(&mut rng);
            let align = alignment(size, 512);
            let off = o.next(&mut rng, size, align);
            assert_eq!(off % align, 0);
            assert!(off + size <= span);
            let want = end.next_multiple_of(align);
            if want + size > span {
                assert_eq!(off, 0);
                wrapped += 1;
            } else {
                assert_eq!(off, want);
            }
            end = off + size;
        }
        assert!(wrapped > 10);
        // One size from 0: exactly 0, bs, 2bs, ...
        let o = Offsets::new(span, 0);
        let offs: Vec<u64> = (0..4).map(|_| o.next(&mut rng, 4096, 4096)).collect();
        assert_eq!(offs, [0, 4096, 8192, 12288]);
    }

    #[test]
    fn random_pct_sets_the_share_of_jumps() {
        let span = 1 << 30;
        let mut rng = fastrand::Rng::with_seed(3);
        let share_sequential = |pct: u8, rng: &mut fastrand::Rng| {
            let o = Offsets::new(span, pct);
            let mut end = 0;
            let mut seq = 0;
            for _ in 0..20_000 {
                let off = o.next(rng, 8192, 4096);
                assert_eq!(off % 4096, 0);
                assert!(off + 8192 <= span);
                if off == end {
                    seq += 1;
                }
                end = off + 8192;
            }
            seq as f64 / 20_000.0
        };
        assert_eq!(share_sequential(0, &mut rng), 1.0);
        assert!(share_sequential(100, &mut rng) < 0.001);
        let s = share_sequential(75, &mut rng);
        assert!((s - 0.25).abs() < 0.02, "{s}");
    }

    #[test]
    fn offsets_align_to_the_size_up_to_4k_and_at_least_the_block() {
        assert_eq!(alignment(512, 512), 512);
        assert_eq!(alignment(2048, 512), 2048);
        assert_eq!(alignment(65536, 512), 4096);
        assert_eq!(alignment(512, 4096), 4096);
        assert_eq!(alignment(1 << 20, 4096), 4096);
    }
}
