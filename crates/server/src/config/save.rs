//! Writing a configuration back as TOML (`ethersan ctl save`): the file
//! `serve --config` reads to the same [`Config`] (a test checks the round
//! trip). Every value is written explicitly, defaults included, so the
//! file does not change meaning when a default does; CHAP secrets are
//! written inline (the file is made mode 0600).

use toml::{Table, Value};

use super::{
    AoeAddress, AoeLink, Backing, ChapConfig, Config, LunConfig, TargetChap, TargetConfig,
};

impl Config {
    /// This configuration as a TOML document.
    pub fn to_toml(&self) -> String {
        let mut top = Table::new();
        top.insert(
            "portals".into(),
            strings(self.portals.iter().map(|p| p.to_string())),
        );
        if let Ok(Value::Table(o)) = Value::try_from(&self.options) {
            top.insert("options".into(), Value::Table(o));
        }
        if let Some(c) = &self.chap {
            top.insert("chap".into(), Value::Table(chap(c, true)));
        }
        if let Some(c) = &self.discovery_chap {
            let mut d = Table::new();
            d.insert("chap".into(), Value::Table(chap(c, false)));
            top.insert("discovery".into(), Value::Table(d));
        }
        if !self.aoe.links.is_empty() || !self.aoe.allowed_macs.is_empty() {
            let mut a = Table::new();
            let (ifaces, unix) = links(&self.aoe.links);
            a.insert("interfaces".into(), ifaces);
            a.insert("unix".into(), unix);
            a.insert(
                "allowed_macs".into(),
                strings(self.aoe.allowed_macs.iter().map(|m| m.to_string())),
            );
            top.insert("aoe".into(), Value::Table(a));
        }
        let e = &self.ethernet;
        if e.enabled() || e.group.is_some() {
            let mut t = Table::new();
            let (ifaces, unix) = links(&e.links);
            t.insert("interfaces".into(), ifaces);
            t.insert("unix".into(), unix);
            t.insert(
                "udp".into(),
                strings(e.udp.iter().map(|u| format!("{},mtu={}", u.addr, u.mtu))),
            );
            if let Some(g) = &e.group {
                t.insert("group".into(), Value::String(g.clone()));
            }
            if let Some(f) = &e.secret_file {
                t.insert("secret_file".into(), Value::String(f.display().to_string()));
            }
            if let Some(s) = &e.secret {
                t.insert("secret".into(), Value::String(s.clone()));
            }
            t.insert(
                "ethertype".into(),
                Value::String(format!("0x{:04X}", e.ethertype)),
            );
            top.insert("ethernet".into(), Value::Table(t));
        }
        top.insert(
            "target".into(),
            Value::Array(
                self.targets
                    .iter()
                    .map(|t| Value::Table(target(t)))
                    .collect(),
            ),
        );
        let mut out = String::from(
            "# Written by `ethersan ctl save`: the running configuration of an\n\
             # ethersan server (`ethersan serve --config THIS_FILE` serves it again).\n\n",
        );
        out.push_str(&toml::to_string(&top).unwrap_or_default());
        out
    }
}

fn strings(items: impl Iterator<Item = String>) -> Value {
    Value::Array(items.map(Value::String).collect())
}

fn links(links: &[AoeLink]) -> (Value, Value) {
    let mut ifaces = Vec::new();
    let mut unix = Vec::new();
    for l in links {
        match l {
            AoeLink::Interface(i) => ifaces.push(i.clone()),
            AoeLink::Unix {
                local,
                peer,
                mac,
                mtu,
            } => {
                let mut s = format!("unix:{},peer={},mtu={mtu}", local.display(), peer.display());
                if let Some(m) = mac {
                    s.push_str(&format!(",mac={m}"));
                }
                unix.push(s);
            }
        }
    }
    (strings(ifaces.into_iter()), strings(unix.into_iter()))
}

fn secret(s: &[u8]) -> Value {
    Value::String(String::from_utf8_lossy(s).into_owned())
}

fn chap(c: &ChapConfig, global: bool) -> Table {
    let mut t = Table::new();
    t.insert("user".into(), Value::String(c.initiator.user.clone()));
    t.insert("secret".into(), secret(&c.initiator.secret));
    if let Some(m) = &c.target {
        t.insert("mutual_user".into(), Value::String(m.user.clone()));
        t.insert("mutual_secret".into(), secret(&m.secret));
    }
    if global {
        t.insert("discovery".into(), Value::Boolean(c.discovery));
    }
    t
}

fn target(t: &TargetConfig) -> Table {
    let mut out = Table::new();
    out.insert("name".into(), Value::String(t.name.clone()));
    if let Some(a) = &t.alias {
        out.insert("alias".into(), Value::String(a.clone()));
    }
    out.insert(
        "allow".into(),
        strings(t.access.rules.iter().map(|r| r.to_string())),
    );
    match &t.chap {
        TargetChap::Inherit => {}
        TargetChap::None => {
            out.insert("chap".into(), Value::String("none".into()));
        }
        TargetChap::Chap(c) => {
            out.insert("chap".into(), Value::Table(chap(c, false)));
        }
    }
    out.insert(
        "lun".into(),
        Value::Array(
            t.luns
                .iter()
                .enumerate()
                .map(|(i, l)| Value::Table(lun(l, t, i)))
                .collect(),
        ),
    );
    out
}

fn lun(l: &LunConfig, t: &TargetConfig, i: usize) -> Table {
    let mut out = Table::new();
    // Implicit numbers stay implicit: the order written is the order read.
    if let Some(n) = l.number {
        out.insert("number".into(), int(n));
    }
    match &l.backing {
        Backing::File { path, size } => {
            out.insert("path".into(), Value::String(path.display().to_string()));
            if let Some(s) = size {
                out.insert("size".into(), int(*s));
            }
        }
        Backing::Ram { size } => {
            out.insert("ram".into(), int(*size));
        }
        Backing::Rbd { spec } => {
            out.insert(
                "rbd".into(),
                Value::String(format!("{}/{}", spec.pool, spec.image)),
            );
            if let Some(s) = spec.create_size {
                out.insert("size".into(), int(s));
            }
            if let Some(c) = &spec.conf {
                out.insert("ceph_conf".into(), Value::String(c.display().to_string()));
            }
            if let Some(i) = &spec.id {
                out.insert("ceph_id".into(), Value::String(i.clone()));
            }
            if let Some(k) = &spec.keyring {
                out.insert(
                    "ceph_keyring".into(),
                    Value::String(k.display().to_string()),
                );
            }
            out.insert("ceph_timeout".into(), int(spec.timeout.as_secs()));
        }
    }
    out.insert("read_only".into(), Value::Boolean(l.read_only));
    out.insert("removable".into(), Value::Boolean(l.removable));
    out.insert("block_size".into(), int(u64::from(l.block_size)));
    out.insert(
        "physical_block_size".into(),
        int(u64::from(l.physical_block_size)),
    );
    if let Some(s) = &l.serial {
        out.insert("serial".into(), Value::String(s.clone()));
    }
    if let Some(n) = &l.naa {
        out.insert("naa".into(), Value::String(super::format_naa(n)));
    }
    out.insert("write_cache".into(), Value::Boolean(l.write_cache));
    out.insert(
        "provisioning".into(),
        Value::String(if l.preallocate { "full" } else { "thin" }.into()),
    );
    out.insert("direct".into(), Value::Boolean(l.direct));
    if l.shared {
        out.insert("shared".into(), Value::Boolean(true));
    }
    if matches!(l.backing, Backing::File { .. }) {
        out.insert("engine".into(), Value::String(l.engine.to_string()));
    }
    if let Some(r) = l.sanitize_rate {
        out.insert("sanitize_rate".into(), int(r));
    }
    match l.aoe {
        AoeAddress::Default => {}
        AoeAddress::Off => {
            out.insert("aoe".into(), Value::String("off".into()));
        }
        AoeAddress::At { shelf, slot } => {
            out.insert("aoe".into(), Value::String(format!("{shelf}.{slot}")));
        }
    }
    out.insert("security".into(), Value::String(l.security.to_string()));
    if let Some(v) = t.access.luns.get(i).filter(|v| !v.is_empty()) {
        out.insert("initiators".into(), strings(v.iter().cloned()));
    }
    if let Some(v) = t.access.read_only.get(i).filter(|v| !v.is_empty()) {
        out.insert("read_only_initiators".into(), strings(v.iter().cloned()));
    }
    out
}

/// A TOML integer (sizes beyond i64 do not occur: they are bytes of a disk).
fn int(v: u64) -> Value {
    Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}
