//! TOML documents, tables and values made from the canonical form (a
//! file written whole, and the parts an edit adds).

use super::canonical::{Tab, V};
use toml_edit::{ArrayOfTables, DocumentMut, InlineTable, Item, Table, Value};

/// The arrays whose elements are tables with an identity (a target's
/// name, a LUN's number), matched by it rather than by place.
pub(super) fn is_keyed_list(key: &str) -> bool {
    key == "target" || key == "lun"
}

/// Each element's identity in a keyed list: a target's name, a LUN's
/// number (given, or the one after the previous LUN's).
pub(super) fn identities(key: &str, list: &[V]) -> Vec<String> {
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
pub(super) fn fresh(top: &Tab) -> DocumentMut {
    let mut doc = DocumentMut::new();
    for (k, v) in &top.0 {
        doc.insert(k, block(k, v));
    }
    doc
}

/// `v` as an item of a `[table]`: tables as `[key]` sections, keyed lists
/// as `[[key]]` arrays of tables, everything else inline.
pub(super) fn block(key: &str, v: &V) -> Item {
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

pub(super) fn block_table(t: &Tab) -> Table {
    let mut out = Table::new();
    for (k, v) in &t.0 {
        out.insert(k, block(k, v));
    }
    // `[discovery]` holding only `[discovery.chap]` is not written.
    out.set_implicit(!t.0.is_empty() && t.0.iter().all(|(_, v)| matches!(v, V::T(_))));
    out
}

pub(super) fn inline(v: &V) -> Value {
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
