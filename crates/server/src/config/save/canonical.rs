//! The canonical form both sides of a save are compared in ([`Tab`]):
//! only keys whose value is not the default, paths relative to the
//! file's directory, LUN numbers only where the order does not imply them.

use std::path::{Component, Path, PathBuf};

use toml_edit::{DocumentMut, Value};

use super::super::{
    format_naa, AoeAddress, AoeConfig, AoeLink, Backing, ChapConfig, Config, EthernetConfig,
    IsnsConfig, LunConfig, Options, TargetChap, TargetConfig, DEFAULT_ENGINE,
};

/// A value in canonical form. Tables keep their keys in the order they
/// are written in a new file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum V {
    S(String),
    I(i64),
    B(bool),
    A(Vec<V>),
    T(Tab),
}

/// A table in canonical form: only keys whose value is not the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Tab(pub(super) Vec<(String, V)>);

impl Tab {
    pub(super) fn get(&self, key: &str) -> Option<&V> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub(super) fn put(&mut self, key: &str, v: V) {
        self.0.push((key.to_string(), v));
    }

    pub(super) fn put_some(&mut self, key: &str, v: Option<V>) {
        if let Some(v) = v {
            self.put(key, v);
        }
    }

    pub(super) fn put_strings(&mut self, key: &str, items: impl IntoIterator<Item = String>) {
        let a: Vec<V> = items.into_iter().map(V::S).collect();
        if !a.is_empty() {
            self.put(key, V::A(a));
        }
    }
}

pub(super) fn s(v: impl Into<String>) -> V {
    V::S(v.into())
}

/// A TOML integer (sizes beyond i64 do not occur: they are bytes of a disk).
pub(super) fn int(v: u64) -> V {
    V::I(i64::try_from(v).unwrap_or(i64::MAX))
}

/// `p` with `.` components dropped.
pub(super) fn clean(p: &Path) -> PathBuf {
    p.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

/// `p` as a file in `base` reads it: relative to `base` when it is inside
/// it, else absolute (`base` empty: as it is, without `./`).
pub(super) fn path_text(p: &Path, base: &Path) -> String {
    let p = if base.as_os_str().is_empty() {
        clean(p)
    } else {
        let abs = |x: &Path| clean(&std::path::absolute(x).unwrap_or_else(|_| x.to_path_buf()));
        let (p, base) = (abs(p), abs(base));
        match p.strip_prefix(&base) {
            Ok(r) => r.to_path_buf(),
            Err(_) => p,
        }
    };
    if p.as_os_str().is_empty() {
        ".".into()
    } else {
        p.display().to_string()
    }
}

/// The whole configuration in canonical form, paths relative to `base`.
pub(super) fn canonical(c: &Config, base: &Path) -> Tab {
    let mut top = Tab::default();
    top.put(
        "portals",
        V::A(
            c.portals
                .iter()
                .map(|p| match c.advertise.get(p) {
                    Some(a) => {
                        let mut t = Tab::default();
                        t.put("listen", s(p.to_string()));
                        t.put("advertise", s(a.to_string()));
                        V::T(t)
                    }
                    None => s(p.to_string()),
                })
                .collect(),
        ),
    );
    let o = options(&c.options, base);
    if !o.0.is_empty() {
        top.put("options", V::T(o));
    }
    top.put_some("chap", c.chap.as_ref().map(|c| V::T(chap(c, true))));
    if let Some(d) = &c.discovery_chap {
        let mut t = Tab::default();
        t.put("chap", V::T(chap(d, false)));
        top.put("discovery", V::T(t));
    }
    if c.aoe != AoeConfig::default() {
        let mut t = Tab::default();
        links(&mut t, &c.aoe.links, base);
        t.put_strings(
            "allowed_macs",
            c.aoe.allowed_macs.iter().map(|m| m.to_string()),
        );
        top.put("aoe", V::T(t));
    }
    if c.ethernet != EthernetConfig::default() {
        top.put("ethernet", V::T(ethernet(&c.ethernet, base)));
    }
    if c.nvme.enabled() {
        let mut t = Tab::default();
        t.put_strings("portals", c.nvme.portals.iter().map(|p| p.to_string()));
        top.put("nvme", V::T(t));
    }
    top.put_some("isns", c.isns.as_ref().map(|i| V::T(isns(i))));
    top.put(
        "target",
        V::A(c.targets.iter().map(|t| V::T(target(t, base))).collect()),
    );
    top
}

/// The options that differ from the defaults, in the order of
/// [`Options`]'s fields.
pub(super) fn options(o: &Options, base: &Path) -> Tab {
    let table = |o: &Options| -> Vec<(String, V)> {
        let doc: Option<DocumentMut> = toml::to_string(o).ok().and_then(|t| t.parse().ok());
        doc.map(|d| {
            d.iter()
                .filter_map(|(k, item)| Some((k.to_string(), from_edit(item.as_value()?)?)))
                .collect()
        })
        .unwrap_or_default()
    };
    let default = Options {
        data_dir: base.join(Options::default().data_dir),
        ..Options::default()
    };
    let dir = |o: &Options| s(path_text(&o.data_dir, base));
    let defaults: Vec<(String, V)> = table(&default)
        .into_iter()
        .map(|(k, v)| {
            if k == "data_dir" {
                (k, dir(&default))
            } else {
                (k, v)
            }
        })
        .collect();
    let mut out = Tab::default();
    for (k, v) in table(o) {
        let v = if k == "data_dir" { dir(o) } else { v };
        if !defaults.iter().any(|(dk, dv)| *dk == k && *dv == v) {
            out.put(&k, v);
        }
    }
    out
}

/// A `toml_edit` value in canonical form (the kinds options use).
pub(super) fn from_edit(v: &Value) -> Option<V> {
    Some(match v {
        Value::String(x) => s(x.value().clone()),
        Value::Integer(x) => V::I(*x.value()),
        Value::Boolean(x) => V::B(*x.value()),
        Value::Array(a) => V::A(a.iter().map(from_edit).collect::<Option<_>>()?),
        _ => return None,
    })
}

pub(super) fn secret(b: &[u8]) -> V {
    s(String::from_utf8_lossy(b).into_owned())
}

pub(super) fn chap(c: &ChapConfig, global: bool) -> Tab {
    let mut t = Tab::default();
    t.put("user", s(c.initiator.user.clone()));
    t.put("secret", secret(&c.initiator.secret));
    if let Some(m) = &c.target {
        t.put("mutual_user", s(m.user.clone()));
        t.put("mutual_secret", secret(&m.secret));
    }
    if global && !c.discovery {
        t.put("discovery", V::B(false));
    }
    t
}

/// `interfaces` and `unix` of `[aoe]` or `[ethernet]`.
pub(super) fn links(t: &mut Tab, links: &[AoeLink], base: &Path) {
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
                let mut u = format!(
                    "unix:{},peer={}",
                    path_text(local, base),
                    path_text(peer, base)
                );
                if let Some(m) = mac {
                    u.push_str(&format!(",mac={m}"));
                }
                if *mtu != ethersan_link::DEFAULT_MTU {
                    u.push_str(&format!(",mtu={mtu}"));
                }
                unix.push(u);
            }
        }
    }
    t.put_strings("interfaces", ifaces);
    t.put_strings("unix", unix);
}

pub(super) fn ethernet(e: &EthernetConfig, base: &Path) -> Tab {
    let mut t = Tab::default();
    links(&mut t, &e.links, base);
    t.put_strings(
        "udp",
        e.udp.iter().map(|u| match u.mtu {
            None => u.addr.to_string(),
            Some(mtu) => format!("{},mtu={mtu}", u.addr),
        }),
    );
    t.put_some("group", e.group.clone().map(s));
    t.put_some(
        "secret_file",
        e.secret_file.as_deref().map(|f| s(path_text(f, base))),
    );
    t.put_some("secret", e.secret.clone().map(s));
    if e.ethertype != ethersan_channel::ETHERTYPE_NATIVE {
        t.put("ethertype", s(format!("0x{:04X}", e.ethertype)));
    }
    t
}

pub(super) fn isns(i: &IsnsConfig) -> Tab {
    let mut t = Tab::default();
    t.put("server", s(i.server()));
    t.put_strings("portals", i.portals.iter().map(|p| p.to_string()));
    t.put_some("entity", i.entity.clone().map(s));
    t
}

pub(super) fn target(t: &TargetConfig, base: &Path) -> Tab {
    let mut out = Tab::default();
    out.put("name", s(t.name.clone()));
    out.put_some("alias", t.alias.clone().map(s));
    out.put_strings("allow", t.access.rules.iter().map(|r| r.to_string()));
    match &t.chap {
        TargetChap::Inherit => {}
        TargetChap::None => out.put("chap", s("none")),
        TargetChap::Chap(c) => out.put("chap", V::T(chap(c, false))),
    }
    // A number is written only where the order does not imply it.
    let mut next = 0;
    let luns = t
        .numbered()
        .into_iter()
        .map(|(n, i)| {
            let implied = n == next;
            next = n.saturating_add(1);
            V::T(lun(&t.luns[i], t, i, (!implied).then_some(n), base))
        })
        .collect();
    out.put("lun", V::A(luns));
    out
}

pub(super) fn lun(
    l: &LunConfig,
    t: &TargetConfig,
    i: usize,
    number: Option<u64>,
    base: &Path,
) -> Tab {
    let mut out = Tab::default();
    out.put_some("number", number.map(int));
    match &l.backing {
        Backing::File { path, size } => {
            out.put("path", s(path_text(path, base)));
            out.put_some("size", size.map(int));
        }
        Backing::Ram { size } => out.put("ram", int(*size)),
        Backing::Rbd { spec } => {
            out.put("rbd", s(format!("{}/{}", spec.pool, spec.image)));
            out.put_some("size", spec.create_size.map(int));
            out.put_some(
                "ceph_conf",
                spec.conf.as_deref().map(|c| s(path_text(c, base))),
            );
            out.put_some("ceph_id", spec.id.clone().map(s));
            out.put_some(
                "ceph_keyring",
                spec.keyring.as_deref().map(|k| s(path_text(k, base))),
            );
            if spec.timeout != ethersan_rbd::DEFAULT_TIMEOUT {
                out.put("ceph_timeout", int(spec.timeout.as_secs()));
            }
        }
    }
    if l.read_only {
        out.put("read_only", V::B(true));
    }
    if l.removable {
        out.put("removable", V::B(true));
    }
    if l.shared {
        out.put("shared", V::B(true));
    }
    if l.block_size != 512 {
        out.put("block_size", int(u64::from(l.block_size)));
    }
    if l.physical_block_size != 4096 {
        out.put("physical_block_size", int(u64::from(l.physical_block_size)));
    }
    out.put_some("serial", l.serial.clone().map(s));
    out.put_some("naa", l.naa.as_ref().map(|n| s(format_naa(n))));
    if !l.write_cache {
        out.put("write_cache", V::B(false));
    }
    if l.preallocate {
        out.put("provisioning", s("full"));
    }
    if l.direct {
        out.put("direct", V::B(true));
    }
    if matches!(l.backing, Backing::File { .. }) && l.engine != DEFAULT_ENGINE {
        out.put("engine", s(l.engine.to_string()));
    }
    out.put_some("sanitize_rate", l.sanitize_rate.map(int));
    match l.aoe {
        AoeAddress::Default => {}
        AoeAddress::Off => out.put("aoe", s("off")),
        AoeAddress::At { shelf, slot } => out.put("aoe", s(format!("{shelf}.{slot}"))),
    }
    if l.security != ethersan_channel::Level::default() {
        out.put("security", s(l.security.to_string()));
    }
    if let Some(v) = t.access.luns.get(i) {
        out.put_strings("initiators", v.iter().cloned());
    }
    if let Some(v) = t.access.read_only.get(i) {
        out.put_strings("read_only_initiators", v.iter().cloned());
    }
    out
}
