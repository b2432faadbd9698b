//! Writing the running configuration back as TOML (`ethersan ctl save`).
//!
//! Into a file that holds a configuration already (the one `serve
//! --config` read), a save is an edit, not a rewrite:
//! [`Config::edit_toml`] compares the running configuration with the one
//! the file describes, table by table and key by key, and changes only
//! what differs, through `toml_edit`, which keeps the comments, order and
//! layout of everything else. Both sides are compared in one canonical
//! form ([`Tab`]): only keys whose value is not the default, paths
//! relative to the file's directory, LUN numbers only where the order does
//! not imply them. So a CHAP secret that comes from `secret_file` or
//! `secret_env` stays a reference while it is unchanged, defaults are not
//! written (a later change of a default applies), paths keep their form
//! (no `./` added per save), and saving an unchanged configuration gives
//! the same bytes. A new file (or one that cannot be edited) is written
//! whole from the canonical form.

use std::path::{Component, Path, PathBuf};

use toml_edit::{Array, ArrayOfTables, DocumentMut, InlineTable, Item, Table, TableLike, Value};

use super::{
    AoeAddress, AoeLink, Backing, ChapConfig, Config, EthernetConfig, IsnsConfig, LunConfig,
    Options, TargetChap, TargetConfig,
};

/// The header of a configuration file written whole.
const HEADER: &str = "# Written by `ethersan ctl save`: the running configuration of an\n\
# ethersan server (`ethersan serve --config THIS_FILE` serves it again).\n\
# Keys left out have their default value (docs/config.md).\n\n";

/// What [`Config::edit_toml`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditedToml {
    /// The text to write.
    pub text: String,
    /// What differs from the existing text, one line each
    /// (`target[iqn…].lun[1] added`); empty when nothing does.
    pub changes: Vec<String>,
    /// The existing text was kept where nothing changed (false: the text
    /// is written whole, because there was none or it could not be
    /// edited).
    pub edited: bool,
    /// Why an existing text could not be edited, if it could not.
    pub note: Option<String>,
}

impl Config {
    /// This configuration as a new TOML document, paths as they are.
    pub fn to_toml(&self) -> String {
        let mut out = String::from(HEADER);
        out.push_str(&fresh(&canonical(self, Path::new(""))).to_string());
        out
    }

    /// The TOML text of this configuration, made by editing `existing`
    /// (the file's text now, if there is one) where it differs.
    /// `origin` names the file in messages; `base` is its directory
    /// (relative paths are written relative to it, as the file is read).
    pub fn edit_toml(&self, existing: Option<&str>, origin: &str, base: &Path) -> EditedToml {
        let new = canonical(self, base);
        let whole = |note: Option<String>| EditedToml {
            text: format!("{HEADER}{}", fresh(&new)),
            changes: vec![match existing {
                Some(_) => format!("{origin} written anew"),
                None => format!("{origin} created"),
            }],
            edited: false,
            note,
        };
        let Some(text) = existing else {
            return whole(None);
        };
        let mut doc: DocumentMut = match text.parse() {
            Ok(d) => d,
            Err(e) => return whole(Some(format!("it is not TOML ({e})"))),
        };
        let old = match Config::parse_toml(text, origin, base) {
            Ok(c) => canonical(&c, base),
            Err(e) => {
                return whole(Some(format!(
                    "it is not a configuration ethersan reads ({e})"
                )))
            }
        };
        let mut ed = Editor::default();
        ed.table(doc.as_table_mut(), &old, &new, "", true, false);
        let edited = doc.to_string();
        // What the edited text reads as must be what runs: anything the
        // edit missed (a key written in a form it does not know) makes the
        // file be written whole instead.
        match Config::parse_toml(&edited, origin, base) {
            Ok(c) if canonical(&c, base) == new => EditedToml {
                text: edited,
                changes: ed.changes,
                edited: true,
                note: None,
            },
            Ok(_) => whole(Some(
                "editing it in place would not give the running configuration".into(),
            )),
            Err(e) => whole(Some(format!("the edited file would not read ({e})"))),
        }
    }
}

/// A value in canonical form. Tables keep their keys in the order they
/// are written in a new file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum V {
    S(String),
    I(i64),
    B(bool),
    A(Vec<V>),
    T(Tab),
}

/// A table in canonical form: only keys whose value is not the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Tab(Vec<(String, V)>);

impl Tab {
    fn get(&self, key: &str) -> Option<&V> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn put(&mut self, key: &str, v: V) {
        self.0.push((key.to_string(), v));
    }

    fn put_some(&mut self, key: &str, v: Option<V>) {
        if let Some(v) = v {
            self.put(key, v);
        }
    }

    fn put_strings(&mut self, key: &str, items: impl IntoIterator<Item = String>) {
        let a: Vec<V> = items.into_iter().map(V::S).collect();
        if !a.is_empty() {
            self.put(key, V::A(a));
        }
    }
}

fn s(v: impl Into<String>) -> V {
    V::S(v.into())
}

/// A TOML integer (sizes beyond i64 do not occur: they are bytes of a disk).
fn int(v: u64) -> V {
    V::I(i64::try_from(v).unwrap_or(i64::MAX))
}

/// `p` with `.` components dropped.
fn clean(p: &Path) -> PathBuf {
    p.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

/// `p` as a file in `base` reads it: relative to `base` when it is inside
/// it, else absolute (`base` empty: as it is, without `./`).
fn path_text(p: &Path, base: &Path) -> String {
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
fn canonical(c: &Config, base: &Path) -> Tab {
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
    if c.aoe != super::AoeConfig::default() {
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
    top.put_some("isns", c.isns.as_ref().map(|i| V::T(isns(i))));
    top.put(
        "target",
        V::A(c.targets.iter().map(|t| V::T(target(t, base))).collect()),
    );
    top
}

/// The options that differ from the defaults, in the order of
/// [`Options`]'s fields.
fn options(o: &Options, base: &Path) -> Tab {
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
fn from_edit(v: &Value) -> Option<V> {
    Some(match v {
        Value::String(x) => s(x.value().clone()),
        Value::Integer(x) => V::I(*x.value()),
        Value::Boolean(x) => V::B(*x.value()),
        Value::Array(a) => V::A(a.iter().map(from_edit).collect::<Option<_>>()?),
        _ => return None,
    })
}

fn secret(b: &[u8]) -> V {
    s(String::from_utf8_lossy(b).into_owned())
}

fn chap(c: &ChapConfig, global: bool) -> Tab {
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
fn links(t: &mut Tab, links: &[AoeLink], base: &Path) {
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

fn ethernet(e: &EthernetConfig, base: &Path) -> Tab {
    let mut t = Tab::default();
    links(&mut t, &e.links, base);
    t.put_strings(
        "udp",
        e.udp.iter().map(|u| {
            if u.mtu == ethersan_link::DEFAULT_MTU {
                u.addr.to_string()
            } else {
                format!("{},mtu={}", u.addr, u.mtu)
            }
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

fn isns(i: &IsnsConfig) -> Tab {
    let mut t = Tab::default();
    t.put("server", s(i.server()));
    t.put_strings("portals", i.portals.iter().map(|p| p.to_string()));
    t.put_some("entity", i.entity.clone().map(s));
    t
}

fn target(t: &TargetConfig, base: &Path) -> Tab {
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

fn lun(l: &LunConfig, t: &TargetConfig, i: usize, number: Option<u64>, base: &Path) -> Tab {
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
    out.put_some("naa", l.naa.as_ref().map(|n| s(super::format_naa(n))));
    if !l.write_cache {
        out.put("write_cache", V::B(false));
    }
    if l.preallocate {
        out.put("provisioning", s("full"));
    }
    if l.direct {
        out.put("direct", V::B(true));
    }
    if matches!(l.backing, Backing::File { .. }) && l.engine != super::DEFAULT_ENGINE {
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

/// The arrays whose elements are tables with an identity (a target's
/// name, a LUN's number), matched by it rather than by place.
fn is_keyed_list(key: &str) -> bool {
    key == "target" || key == "lun"
}

/// Each element's identity in a keyed list: a target's name, a LUN's
/// number (given, or the one after the previous LUN's).
fn identities(key: &str, list: &[V]) -> Vec<String> {
    let mut next = 0i64;
    list.iter()
        .map(|v| {
            let V::T(t) = v else {
                return String::new();
            };
            if key == "target" {
                return match t.get("name") {
                    Some(V::S(n)) => n.clone(),
                    _ => String::new(),
                };
            }
            let n = match t.get("number") {
                Some(V::I(n)) => *n,
                _ => next,
            };
            next = n.saturating_add(1);
            n.to_string()
        })
        .collect()
}

/// A new document holding `top`.
fn fresh(top: &Tab) -> DocumentMut {
    let mut doc = DocumentMut::new();
    for (k, v) in &top.0 {
        doc.insert(k, block(k, v));
    }
    doc
}

/// `v` as an item of a `[table]`: tables as `[key]` sections, keyed lists
/// as `[[key]]` arrays of tables, everything else inline.
fn block(key: &str, v: &V) -> Item {
    match v {
        V::T(t) => Item::Table(block_table(t)),
        V::A(list) if is_keyed_list(key) && !list.is_empty() => {
            let mut aot = ArrayOfTables::new();
            for e in list {
                if let V::T(t) = e {
                    aot.push(block_table(t));
                }
            }
            Item::ArrayOfTables(aot)
        }
        v => Item::Value(inline(v)),
    }
}

fn block_table(t: &Tab) -> Table {
    let mut out = Table::new();
    for (k, v) in &t.0 {
        out.insert(k, block(k, v));
    }
    // `[discovery]` holding only `[discovery.chap]` is not written.
    out.set_implicit(!t.0.is_empty() && t.0.iter().all(|(_, v)| matches!(v, V::T(_))));
    out
}

fn inline(v: &V) -> Value {
    match v {
        V::S(x) => Value::from(x.as_str()),
        V::I(x) => Value::from(*x),
        V::B(x) => Value::from(*x),
        V::A(a) => Value::Array(a.iter().map(inline).collect()),
        V::T(t) => {
            let mut out = InlineTable::new();
            for (k, v) in &t.0 {
                out.insert(k, inline(v));
            }
            Value::InlineTable(out)
        }
    }
}

/// Edits a document in place, noting each change.
#[derive(Default)]
struct Editor {
    changes: Vec<String>,
}

impl Editor {
    /// Make `d`, which reads as `old`, read as `new`, touching only the
    /// keys that differ. `block`: `d` is a `[table]` (not inline); `chap`:
    /// `d` is a CHAP table (a secret written there replaces the
    /// `secret_file`/`secret_env` it came from).
    fn table(
        &mut self,
        d: &mut dyn TableLike,
        old: &Tab,
        new: &Tab,
        path: &str,
        block: bool,
        chap: bool,
    ) {
        let at = |k: &str| {
            if path.is_empty() {
                k.to_string()
            } else {
                format!("{path} {k}")
            }
        };
        for (k, nv) in &new.0 {
            let ov = old.get(k);
            if ov == Some(nv) {
                continue;
            }
            let here = at(k);
            match (d.get_mut(k), ov) {
                (Some(item), Some(ov)) => self.item(item, k, ov, nv, &here, chap || k == "chap"),
                (None, _) | (Some(_), None) => {
                    // A key the file has in another form (an explicit
                    // default, a spec string) is replaced in place.
                    let item = if block {
                        self::block(k, nv)
                    } else {
                        Item::Value(inline(nv))
                    };
                    match d.get_mut(k) {
                        Some(existing) => replace(existing, item),
                        None => {
                            d.insert(k, item);
                        }
                    }
                    self.changes.push(format!("{here} added"));
                }
            }
            if chap && (k == "secret" || k == "mutual_secret") {
                d.remove(&format!("{k}_file"));
                d.remove(&format!("{k}_env"));
            }
            if k == "allow" {
                // A target's rules written as `allow` replace the lists of
                // before the rules, which would otherwise add theirs again;
                // the comment above the first of them stays, above `allow`.
                let decor = ["allow_initiators", "allow_networks"]
                    .iter()
                    .find_map(|old| d.key(old).map(|key| key.leaf_decor().clone()));
                d.remove("allow_initiators");
                d.remove("allow_networks");
                if let (Some(decor), Some(mut key)) = (decor, d.key_mut("allow")) {
                    *key.leaf_decor_mut() = decor;
                }
            }
        }
        for (k, _) in &old.0 {
            if new.get(k).is_none() {
                d.remove(k);
                if k == "allow" {
                    d.remove("allow_initiators");
                    d.remove("allow_networks");
                }
                if chap && (k == "secret" || k == "mutual_secret") {
                    d.remove(&format!("{k}_file"));
                    d.remove(&format!("{k}_env"));
                }
                self.changes.push(format!("{} removed", at(k)));
            }
        }
    }

    /// Make `item` (under `key`), which reads as `old`, read as `new`.
    fn item(&mut self, item: &mut Item, key: &str, old: &V, new: &V, path: &str, chap: bool) {
        match (old, new) {
            (V::T(o), V::T(n)) if item.is_table_like() => {
                let block = item.is_table();
                if let Some(t) = item.as_table_like_mut() {
                    self.table(t, o, n, path, block, chap);
                }
            }
            (V::A(o), V::A(n)) if is_keyed_list(key) => self.keyed_list(item, key, o, n, path),
            (V::A(o), V::A(n)) if item.is_array() => {
                if let Some(a) = item.as_array_mut() {
                    let out = reuse(a, o, n, |_| None);
                    *a = out;
                }
                self.changes.push(format!("{path} changed"));
            }
            _ => {
                let fresh = if item.is_table() {
                    self::block(key, new)
                } else {
                    Item::Value(inline(new))
                };
                replace(item, fresh);
                self.changes.push(format!("{path} changed"));
            }
        }
    }

    /// A list of targets or LUNs: elements matched by identity, each kept
    /// (and edited where it changed), new ones added, gone ones dropped.
    fn keyed_list(&mut self, item: &mut Item, key: &str, old: &[V], new: &[V], path: &str) {
        let (old_ids, new_ids) = (identities(key, old), identities(key, new));
        let what = if key == "target" { "target" } else { "LUN" };
        // `target NAME LUN 1`, not `target NAME lun LUN 1`.
        let parent = path.strip_suffix(key).unwrap_or(path).trim_end();
        let el = |id: &str| {
            if parent.is_empty() {
                format!("{what} {id}")
            } else {
                format!("{parent} {what} {id}")
            }
        };
        for id in &old_ids {
            if !new_ids.contains(id) {
                self.changes.push(format!("{} removed", el(id)));
            }
        }
        let old_of = |j: usize| old_ids.iter().position(|id| *id == new_ids[j]);
        match item {
            Item::ArrayOfTables(aot) => {
                let mut out = ArrayOfTables::new();
                for (j, nv) in new.iter().enumerate() {
                    let V::T(nt) = nv else { continue };
                    let here = el(&new_ids[j]);
                    match old_of(j).and_then(|i| Some((i, aot.get(i)?.clone()))) {
                        Some((i, mut t)) => {
                            if let V::T(ot) = &old[i] {
                                self.table(&mut t, ot, nt, &here, true, false);
                            }
                            out.push(t);
                        }
                        None => {
                            out.push(block_table(nt));
                            self.changes.push(format!("{} added", el(&new_ids[j])));
                        }
                    }
                }
                *item = if out.is_empty() {
                    // `lun = []`: a target with no LUNs yet.
                    Item::Value(Value::Array(Array::new()))
                } else {
                    Item::ArrayOfTables(out)
                };
            }
            Item::Value(Value::Array(a)) if a.is_empty() && !new.is_empty() => {
                // `lun = []` that gets LUNs: written as `[[target.lun]]`.
                *item = block(key, &V::A(new.to_vec()));
                for id in &new_ids {
                    self.changes.push(format!("{} added", el(id)));
                }
            }
            Item::Value(Value::Array(a)) => {
                let mut added = Vec::new();
                let out = reuse(a, old, new, |j| {
                    // A changed inline table is edited; a spec string that
                    // changed is replaced by a table.
                    let i = old_of(j)?;
                    let (V::T(ot), V::T(nt)) = (&old[i], &new[j]) else {
                        return None;
                    };
                    let mut t = a.get(i)?.as_inline_table()?.clone();
                    let mut sub = Editor::default();
                    sub.table(&mut t, ot, nt, "", false, false);
                    Some(Value::InlineTable(t))
                });
                for (j, id) in new_ids.iter().enumerate() {
                    match old_of(j) {
                        None => added.push(format!("{} added", el(id))),
                        Some(i) if old[i] != new[j] => added.push(format!("{} changed", el(id))),
                        Some(_) => {}
                    }
                }
                self.changes.extend(added);
                *a = out;
            }
            other => {
                *other = block(key, &V::A(new.to_vec()));
                self.changes.push(format!("{path} changed"));
            }
        }
    }
}

/// `new` as an array built from `a` (which reads as `old`): an element
/// equal to one of `old` keeps its text and comments; `edit(j)` may make
/// the `j`th from the old element it replaces; anything else is written
/// new, laid out as the last element was.
fn reuse(a: &Array, old: &[V], new: &[V], mut edit: impl FnMut(usize) -> Option<Value>) -> Array {
    let mut used = vec![false; old.len()];
    let mut out = Array::new();
    // New elements are laid out as the last one is (on a line of their
    // own in a list written one per line), after the first.
    let layout = (a.len() >= 2)
        .then(|| a.iter().last().map(|v| v.decor().clone()))
        .flatten();
    for (j, nv) in new.iter().enumerate() {
        let same = (0..old.len()).find(|&i| !used[i] && old[i] == *nv);
        let v = match same.and_then(|i| Some((i, a.get(i)?))) {
            Some((i, e)) => {
                used[i] = true;
                e.clone()
            }
            None => edit(j).unwrap_or_else(|| {
                let mut v = inline(nv);
                match &layout {
                    Some(d) => *v.decor_mut() = d.clone(),
                    None if out.is_empty() => v.decor_mut().set_prefix(""),
                    None => v.decor_mut().set_prefix(" "),
                }
                v
            }),
        };
        out.push_formatted(v);
    }
    out.set_trailing(a.trailing().clone());
    out.set_trailing_comma(a.trailing_comma() && !out.is_empty());
    *out.decor_mut() = a.decor().clone();
    out
}

/// Put `new` where `item` is, keeping the comments and spacing around a
/// value (`key = VALUE  # comment`).
fn replace(item: &mut Item, mut new: Item) {
    if let (Item::Value(old), Item::Value(n)) = (&*item, &mut new) {
        *n.decor_mut() = old.decor().clone();
    }
    if let (Item::Table(old), Item::Table(n)) = (&*item, &mut new) {
        *n.decor_mut() = old.decor().clone();
        if let Some(p) = old.position() {
            n.set_position(p);
        }
    }
    *item = new;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-written file: comments, an order of its own, a secret in a
    /// file, spec strings and tables, explicit defaults.
    const FILE: &str = r#"# Storage for the lab.
portals = ["127.0.0.1:3260"]  # loopback only for now

[options]
queue_depth = 64   # the old HBA cannot take more

# CHAP for everyone; the secret stays out of this file.
[chap]
user = "lab"
secret_file = "chap.secret"

[[target]]
name = "iqn.2026-11.org.ethersan:lab"
# who may log in
allow_initiators = ["iqn.2026-11.org.ethersan:a"]

# The system disk.
[[target.lun]]
path = "disk0.img"
size = "16M"
write_cache = true   # explicit default, kept

# Scratch space.
[[target.lun]]
ram = "8M"

[[target]]
name = "iqn.2026-11.org.ethersan:other"
lun = ["ram:4M"]  # spec strings
"#;

    fn setup() -> (tempfile::TempDir, PathBuf, Config) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("chap.secret"), "a-secret-of-12+\n").unwrap();
        let file = dir.path().join("ethersan.toml");
        std::fs::write(&file, FILE).unwrap();
        let cfg = Config::from_toml_file(&file).unwrap();
        (dir, file, cfg)
    }

    fn edit(cfg: &Config, file: &Path) -> EditedToml {
        let text = std::fs::read_to_string(file).unwrap();
        cfg.edit_toml(Some(&text), "ethersan.toml", file.parent().unwrap())
    }

    #[test]
    fn an_unchanged_configuration_saves_to_the_same_bytes() {
        let (_dir, file, cfg) = setup();
        let e = edit(&cfg, &file);
        assert_eq!(e.text, FILE);
        assert!(e.edited && e.changes.is_empty(), "{e:?}");
        // The saved text reads back the same, and again saves the same.
        let again = Config::from_toml_file(&file).unwrap();
        assert_eq!(edit(&again, &file).text, FILE);
    }

    #[test]
    fn a_change_touches_only_its_keys_and_keeps_comments_and_references() {
        let (dir, file, mut cfg) = setup();
        // What `ctl lun add`, `ctl lun rm`, `ctl acl add` do: numbers
        // pinned, a LUN added and one removed, a network granted.
        let t = &mut cfg.targets[0];
        for (n, i) in t.numbered() {
            t.luns[i].number = Some(n);
        }
        let mut l = LunConfig::from_spec(&format!("{}:1M", dir.path().join("disk2.img").display()))
            .unwrap();
        l.number = Some(2);
        t.luns.push(l);
        t.luns.remove(1);
        t.access.rules.push(super::super::access::AclRule::network((
            "10.0.0.0".parse().unwrap(),
            8,
        )));
        let e = edit(&cfg, &file);
        let expected = FILE
            .replace(
                "allow_initiators = [\"iqn.2026-11.org.ethersan:a\"]\n",
                "allow = [\"iqn.2026-11.org.ethersan:a\", \"10.0.0.0/8\"]\n",
            )
            .replace(
                "# Scratch space.\n[[target.lun]]\nram = \"8M\"\n",
                "[[target.lun]]\nnumber = 2\npath = \"disk2.img\"\nsize = 1048576\n",
            );
        assert_eq!(e.text, expected, "{:?}", e.changes);
        assert!(e.edited, "{e:?}");
        assert_eq!(
            e.changes,
            vec![
                "target iqn.2026-11.org.ethersan:lab allow added",
                "target iqn.2026-11.org.ethersan:lab LUN 1 removed",
                "target iqn.2026-11.org.ethersan:lab LUN 2 added",
            ]
        );
        // It reads back as what runs (numbers included).
        std::fs::write(&file, &e.text).unwrap();
        let back = Config::from_toml_file(&file).unwrap();
        assert_eq!(canonical(&back, dir.path()), canonical(&cfg, dir.path()));
        assert_eq!(back.targets[0].numbered(), vec![(0, 0), (2, 1)]);
    }

    #[test]
    fn a_list_of_spec_strings_keeps_its_strings() {
        let (_dir, file, mut cfg) = setup();
        let t = &mut cfg.targets[1];
        t.luns.push(LunConfig::from_spec("ram:2M").unwrap());
        t.access
            .rules
            .push(super::super::access::AclRule::initiator(
                "iqn.2026-11.org.ethersan:b",
            ));
        let e = edit(&cfg, &file);
        assert!(
            e.text.ends_with(
                "name = \"iqn.2026-11.org.ethersan:other\"\nlun = [\"ram:4M\", { ram = 2097152 }]  # spec strings\nallow = [\"iqn.2026-11.org.ethersan:b\"]\n"
            ),
            "{}",
            e.text
        );
        assert!(e.text.starts_with(
            &FILE[..FILE
                .find("[[target]]\nname = \"iqn.2026-11.org.ethersan:other")
                .unwrap()]
        ));
    }

    #[test]
    fn a_new_secret_replaces_the_reference_and_defaults_are_not_written() {
        let (dir, file, mut cfg) = setup();
        let c = cfg.chap.as_mut().unwrap();
        c.initiator = ethersan_proto::chap::Credentials::new("lab", b"another-secret-1").unwrap();
        cfg.options.queue_depth = Options::default().queue_depth;
        let e = edit(&cfg, &file);
        assert!(
            e.text
                .contains("user = \"lab\"\nsecret = \"another-secret-1\"\n"),
            "{}",
            e.text
        );
        assert!(!e.text.contains("secret_file"), "{}", e.text);
        assert!(!e.text.contains("queue_depth"), "{}", e.text);
        assert!(e
            .text
            .contains("write_cache = true   # explicit default, kept"));
        std::fs::write(&file, &e.text).unwrap();
        let back = Config::from_toml_file(&file).unwrap();
        assert_eq!(canonical(&back, dir.path()), canonical(&cfg, dir.path()));
    }

    #[test]
    fn a_new_file_has_no_defaults_and_no_dot_paths() {
        let (dir, _file, cfg) = setup();
        let e = cfg.edit_toml(None, "new.toml", dir.path());
        assert!(!e.edited);
        for default in ["max_burst_length", "read_only", "engine", "data_dir", "./"] {
            assert!(!e.text.contains(default), "{default} in\n{}", e.text);
        }
        assert!(e.text.contains("path = \"disk0.img\""), "{}", e.text);
        // Saved, read and saved again: the same text (no `./` per save).
        let file = dir.path().join("new.toml");
        std::fs::write(&file, &e.text).unwrap();
        let back = Config::from_toml_file(&file).unwrap();
        assert_eq!(format!("{:?}", back.options), format!("{:?}", cfg.options));
        let again = back.edit_toml(None, "new.toml", dir.path());
        assert_eq!(again.text, e.text);
    }
}
