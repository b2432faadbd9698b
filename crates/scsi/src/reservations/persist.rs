//! The reservations kept outside the process: the APTPL state file
//! (written atomically, read at start) and, with shared state, the blob
//! `"pr"` and its log of notices.

use std::io::Write;
use std::path::Path;

use super::{valid_type, Holder, ItNexus, Notice, Registration, Reservations, NOTICE_LOG};
use crate::alua::BlobError;
use crate::sense::Sense;
use crate::Nexus;

impl Reservations {
    /// Append `notices` to the shared log, numbering them.
    pub(crate) fn log_notices(&mut self, notices: &mut [Notice]) {
        for n in notices.iter_mut() {
            self.next_seq += 1;
            n.seq = self.next_seq;
            self.log.push_back(*n);
        }
        // Never trim this change's own notices (a CLEAR or PREEMPT of more
        // than NOTICE_LOG registrants): the other gateways must see them.
        let keep = NOTICE_LOG.max(notices.len());
        while self.log.len() > keep {
            self.log.pop_front();
        }
    }

    /// The logged notices after sequence `seen`.
    pub(crate) fn notices_after(&self, seen: u64) -> impl Iterator<Item = &Notice> {
        self.log.iter().filter(move |n| n.seq > seen)
    }

    /// The last sequence number given to a notice.
    pub(crate) fn last_seq(&self) -> u64 {
        self.next_seq
    }

    /// The shared blob `"pr"`: a header line `ethersan-pr 1`, then lines
    /// `generation <n>`, `aptpl <0|1>`, `seq <last notice>`,
    /// `reg <nexus hex> <port> <all_tg_pt 0|1> <key hex> <name|->`,
    /// `holder <nexus hex> <port> <type>`,
    /// `notice <seq> <nexus hex> <port> <all 0|1> <key> <asc> <ascq> <abort 0|1>`
    /// and `event <seq> <origin port> <key> <asc> <ascq>` (a unit
    /// attention for every nexus of the other gateways).
    /// Readers skip line kinds they do not know (forward compatible).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut t = format!(
            "ethersan-pr 1\ngeneration {}\naptpl {}\nseq {}\n",
            self.generation,
            u8::from(self.aptpl),
            self.next_seq
        );
        for (it, r) in &self.keys {
            let name = if r.name.is_empty() || r.name.contains(char::is_whitespace) {
                "-"
            } else {
                &r.name
            };
            t.push_str(&format!(
                "reg {:x} {} {} {:x} {}\n",
                it.nexus.0,
                it.port,
                u8::from(r.all_ports),
                r.key,
                name
            ));
        }
        if let Some(h) = self.holder {
            t.push_str(&format!(
                "holder {:x} {} {}\n",
                h.it.nexus.0, h.it.port, h.kind
            ));
        }
        for n in &self.log {
            if n.to_all {
                t.push_str(&format!(
                    "event {} {} {} {} {}\n",
                    n.seq, n.it.port, n.sense.key, n.sense.asc, n.sense.ascq
                ));
                continue;
            }
            t.push_str(&format!(
                "notice {} {:x} {} {} {} {} {} {}\n",
                n.seq,
                n.it.nexus.0,
                n.it.port,
                u8::from(n.all_ports),
                n.sense.key,
                n.sense.asc,
                n.sense.ascq,
                u8::from(n.abort)
            ));
        }
        t.into_bytes()
    }

    /// Replace the shared part of the state with the blob `data`
    /// ([`encode`](Self::encode); empty: nothing registered). On error
    /// nothing changes.
    pub(crate) fn decode_shared(&mut self, data: &[u8]) -> Result<(), BlobError> {
        let mut fresh = Reservations::default();
        if !data.is_empty() {
            let text = std::str::from_utf8(data).map_err(|_| BlobError::Header("pr"))?;
            let mut lines = text.lines();
            match lines
                .next()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
            {
                Some(h) if h.len() == 2 && h[0] == "ethersan-pr" && h[1].parse::<u32>().is_ok() => {
                }
                _ => return Err(BlobError::Header("pr")),
            }
            for (i, line) in lines.enumerate() {
                parse_line(&mut fresh, line).ok_or_else(|| BlobError::Line(i + 2, line.into()))?;
            }
        }
        self.generation = fresh.generation;
        self.aptpl = fresh.aptpl;
        self.next_seq = fresh.next_seq;
        self.keys = fresh.keys;
        self.holder = fresh.holder;
        self.log = fresh.log;
        Ok(())
    }

    /// Save the state when APTPL asks for it (or remove a stale file).
    pub(super) fn save(&self) {
        let Some(path) = &self.state_file else { return };
        if !self.aptpl || self.keys.is_empty() {
            let _ = std::fs::remove_file(path);
            return;
        }
        let mut text = format!("generation {}\n", self.generation);
        for (it, r) in &self.keys {
            text.push_str(&format!(
                "key {:016x} {:016x} {}\n",
                it.nexus.0, r.key, r.name
            ));
        }
        if let Some(h) = self.holder {
            text.push_str(&format!("holder {:016x} {}\n", h.it.nexus.0, h.kind));
        }
        if let Err(e) = write_atomically(path, text.as_bytes()) {
            tracing::error!(path = %path.display(), %e, "cannot save persistent reservations");
        }
    }

    pub(super) fn load(&mut self, path: &Path) {
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["generation", g] => self.generation = g.parse().unwrap_or(0),
                ["key", n, k, rest @ ..] => {
                    if let (Ok(n), Ok(k)) = (u64::from_str_radix(n, 16), u64::from_str_radix(k, 16))
                    {
                        let name = rest.first().map(|s| (*s).to_string()).unwrap_or_default();
                        if !name.is_empty() {
                            self.names.insert(Nexus(n), name.clone());
                        }
                        let it = ItNexus {
                            nexus: Nexus(n),
                            port: self.port,
                        };
                        self.keys.insert(
                            it,
                            Registration {
                                key: k,
                                all_ports: false,
                                name,
                            },
                        );
                    }
                }
                ["holder", n, t] => {
                    if let (Ok(n), Ok(t)) = (u64::from_str_radix(n, 16), t.parse()) {
                        self.holder = Some(Holder {
                            it: ItNexus {
                                nexus: Nexus(n),
                                port: self.port,
                            },
                            kind: t,
                        });
                    }
                }
                _ => {
                    tracing::warn!(path = %path.display(), line, "ignoring unreadable reservation line")
                }
            }
        }
        self.aptpl = !self.keys.is_empty();
    }
}

/// One line of a `"pr"` blob into `r`; `None` if a known kind of line
/// does not parse (unknown kinds are skipped).
fn parse_line(r: &mut Reservations, line: &str) -> Option<()> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    match f.as_slice() {
        ["generation", g] => r.generation = g.parse().ok()?,
        ["aptpl", a] => r.aptpl = *a == "1",
        ["seq", s] => r.next_seq = s.parse().ok()?,
        ["reg", n, port, all, k, name] => {
            let it = ItNexus {
                nexus: Nexus(hex(n)?),
                port: port.parse().ok()?,
            };
            let name = if *name == "-" { "" } else { name };
            let reg = Registration {
                key: hex(k)?,
                all_ports: *all == "1",
                name: name.to_string(),
            };
            r.keys.insert(it, reg);
        }
        ["holder", n, port, kind] => {
            let it = ItNexus {
                nexus: Nexus(hex(n)?),
                port: port.parse().ok()?,
            };
            let kind: u8 = kind.parse().ok()?;
            if !valid_type(kind) {
                return None;
            }
            r.holder = Some(Holder { it, kind });
        }
        ["notice", seq, n, port, all, k, asc, ascq, abort] => {
            r.log.push_back(Notice {
                seq: seq.parse().ok()?,
                it: ItNexus {
                    nexus: Nexus(hex(n)?),
                    port: port.parse().ok()?,
                },
                all_ports: *all == "1",
                sense: Sense::new(k.parse().ok()?, asc.parse().ok()?, ascq.parse().ok()?),
                abort: *abort == "1",
                to_all: false,
            });
        }
        ["event", seq, port, k, asc, ascq] => {
            let sense = Sense::new(k.parse().ok()?, asc.parse().ok()?, ascq.parse().ok()?);
            let mut n = Notice::to_all(port.parse().ok()?, sense);
            n.seq = seq.parse().ok()?;
            r.log.push_back(n);
        }
        [kind, ..]
            if matches!(
                *kind,
                "generation" | "aptpl" | "seq" | "reg" | "holder" | "notice" | "event"
            ) =>
        {
            return None
        }
        _ => {}
    }
    Some(())
}

/// Write a file so that a crash leaves either the old or the new content:
/// write a temporary file, fsync it, rename it over, fsync the directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
