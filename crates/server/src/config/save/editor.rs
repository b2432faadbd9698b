//! Editing a document in place where the running configuration differs
//! from the one it describes, keeping comments, order and layout.

use super::canonical::{Tab, V};
use super::document::{block, block_table, identities, inline, is_keyed_list};
use toml_edit::{Array, ArrayOfTables, Item, TableLike, Value};

/// Edits a document in place, noting each change.
#[derive(Default)]
pub(super) struct Editor {
    pub(super) changes: Vec<String>,
}

impl Editor {
    /// Make `d`, which reads as `old`, read as `new`, touching only the
    /// keys that differ. `block`: `d` is a `[table]` (not inline); `chap`:
    /// `d` is a CHAP table (a secret written there replaces the
    /// `secret_file`/`secret_env` it came from).
    pub(super) fn table(
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
    pub(super) fn item(
        &mut self,
        item: &mut Item,
        key: &str,
        old: &V,
        new: &V,
        path: &str,
        chap: bool,
    ) {
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
    pub(super) fn keyed_list(
        &mut self,
        item: &mut Item,
        key: &str,
        old: &[V],
        new: &[V],
        path: &str,
    ) {
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
pub(super) fn reuse(
    a: &Array,
    old: &[V],
    new: &[V],
    mut edit: impl FnMut(usize) -> Option<Value>,
) -> Array {
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
pub(super) fn replace(item: &mut Item, mut new: Item) {
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
