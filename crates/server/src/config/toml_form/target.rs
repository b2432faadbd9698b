//! One `[[target]]` of the TOML form: its name, its `[[target.lun]]`s
//! (a spec string or a table), its access rules and its CHAP.

use std::ops::Range;

use toml::Spanned;

use super::super::{
    parse_naa, parse_network, validate_initiator_name, validate_name, Access, AclRule, Backing,
    ConfigError, LunConfig, TargetChap, TargetConfig, DEFAULT_ENGINE,
};
use super::raw::{raw_size, RawLun, RawLunTable, RawTarget, RawTargetChap};
use super::source::{line_col, Source};

/// One `[[target]]`; `before`: the targets read before it (a name is
/// used once). Returns the target and the spans of its LUNs, for the
/// errors found across targets.
pub(super) fn target(
    src: &Source,
    t: Spanned<RawTarget>,
    before: &[TargetConfig],
) -> Result<(TargetConfig, Vec<Range<usize>>), ConfigError> {
    let tspan = t.span();
    let mut t = t.into_inner();
    validate_name(t.name.get_ref()).map_err(|e| src.at(Some(t.name.span()), e.to_string()))?;
    if before.iter().any(|o| &o.name == t.name.get_ref()) {
        return Err(src.at(
            Some(t.name.span()),
            format!("duplicate target name {:?}", t.name.get_ref()),
        ));
    }
    let Some(raw_luns) = t.luns.take() else {
        return Err(src.at(
            Some(tspan),
            format!(
                "target {:?} has no [[target.lun]] (write lun = [] for a target with no LUNs yet)",
                t.name.get_ref()
            ),
        ));
    };
    let spans: Vec<Range<usize>> = raw_luns.iter().map(|l| l.span()).collect();
    let mut luns = Vec::new();
    let mut lun_initiators: Vec<Vec<String>> = Vec::new();
    let mut lun_read_only: Vec<Vec<String>> = Vec::new();
    for l in raw_luns {
        let (lun, seen_by, read_only_for) = lun(src, l)?;
        luns.push(lun);
        lun_initiators.push(seen_by);
        lun_read_only.push(read_only_for);
    }
    unique_numbers(src, t.name.get_ref(), &luns, &spans)?;
    let access = access(src, &t, lun_initiators, lun_read_only)?;
    let chap = chap(src, &mut t)?;
    let target = TargetConfig {
        name: t.name.into_inner(),
        alias: t.alias,
        luns,
        access,
        chap,
    };
    Ok((target, spans))
}

/// One `[[target.lun]]`: the LUN, the initiators it is shown to (empty:
/// all) and those it is read-only for.
fn lun(
    src: &Source,
    l: Spanned<RawLun>,
) -> Result<(LunConfig, Vec<String>, Vec<String>), ConfigError> {
    let span = l.span();
    match l.into_inner() {
        RawLun::Spec(s) => {
            let mut lun =
                LunConfig::from_spec(&s).map_err(|e| src.at(Some(span.clone()), e.to_string()))?;
            if let Backing::File { path, .. } = &mut lun.backing {
                *path = src.base.join(&*path);
            }
            Ok((lun, Vec::new(), Vec::new()))
        }
        RawLun::Table(tb) => {
            let (seen_by, read_only_for) = (tb.initiators.clone(), tb.read_only_initiators.clone());
            Ok((lun_table(src, span, *tb)?, seen_by, read_only_for))
        }
    }
}

/// A LUN written as a table (`path`/`ram`/`rbd` and its settings) at
/// `span`.
fn lun_table(src: &Source, span: Range<usize>, tb: RawLunTable) -> Result<LunConfig, ConfigError> {
    for i in &tb.initiators {
        validate_initiator_name(i)
            .map_err(|e| src.at(Some(span.clone()), format!("initiators: {e}")))?;
    }
    for i in &tb.read_only_initiators {
        validate_initiator_name(i)
            .map_err(|e| src.at(Some(span.clone()), format!("read_only_initiators: {e}")))?;
    }
    if tb.rbd.is_none()
        && (tb.ceph_conf.is_some()
            || tb.ceph_id.is_some()
            || tb.ceph_keyring.is_some()
            || tb.ceph_timeout.is_some())
    {
        return Err(src.at(
            Some(span),
            "ceph_conf, ceph_id, ceph_keyring and ceph_timeout go with rbd = \"POOL/IMAGE\"".into(),
        ));
    }
    let backing = match (&tb.path, &tb.ram) {
        (None, None) if tb.rbd.is_some() => {
            let mut text = tb.rbd.clone().unwrap_or_default();
            if let Some(s) = &tb.size {
                let bytes = raw_size(s).map_err(|e| src.at(Some(span.clone()), e.to_string()))?;
                text.push_str(&format!(":{bytes}"));
            }
            if let Some(c) = &tb.ceph_conf {
                text.push_str(&format!(",conf={}", src.base.join(c).display()));
            }
            if let Some(i) = &tb.ceph_id {
                text.push_str(&format!(",id={i}"));
            }
            if let Some(k) = &tb.ceph_keyring {
                text.push_str(&format!(",keyring={}", src.base.join(k).display()));
            }
            if let Some(t) = tb.ceph_timeout {
                text.push_str(&format!(",timeout={t}"));
            }
            Backing::Rbd {
                spec: ethersan_rbd::RbdSpec::parse(&text)
                    .map_err(|e| src.at(Some(span.clone()), format!("rbd: {e}")))?,
            }
        }
        (Some(p), None) if tb.rbd.is_none() => Backing::File {
            path: src.base.join(p),
            size: tb.size.as_ref().map(raw_size).transpose().map_err(|e| src.at(Some(span.clone()), e.to_string()))?,
        },
        (None, Some(r)) if tb.size.is_none() && tb.rbd.is_none() => {
            Backing::Ram { size: raw_size(r).map_err(|e| src.at(Some(span.clone()), e.to_string()))? }
        }
        _ => {
            return Err(src.at(
                Some(span),
                "a LUN needs exactly one of path = \"...\" (with optional size), ram = \"SIZE\" or rbd = \"POOL/IMAGE\" (with optional size)".into(),
            ))
        }
    };
    let lun = LunConfig {
        number: tb.number,
        backing,
        read_only: tb.read_only,
        removable: tb.removable,
        block_size: tb.block_size.unwrap_or(512),
        serial: tb.serial,
        naa: tb
            .naa
            .as_deref()
            .map(parse_naa)
            .transpose()
            .map_err(|m| src.at(Some(span.clone()), m))?,
        write_cache: tb.write_cache.unwrap_or(true),
        aoe: match tb.aoe.as_deref() {
            None => super::super::AoeAddress::Default,
            Some(a) => a.parse().map_err(|m| src.at(Some(span.clone()), m))?,
        },
        security: match tb.security.as_deref() {
            None => ethersan_channel::Level::default(),
            Some(l) => l
                .parse()
                .map_err(|m| src.at(Some(span.clone()), format!("security = {m}")))?,
        },
        physical_block_size: tb.physical_block_size.unwrap_or(4096),
        direct: tb.direct,
        shared: tb.shared,
        sanitize_rate: tb
            .sanitize_rate
            .as_ref()
            .map(raw_size)
            .transpose()
            .map_err(|e| src.at(Some(span.clone()), format!("sanitize_rate: {e}")))?,
        engine: match tb.engine.as_deref() {
            None => DEFAULT_ENGINE,
            Some(e) => e
                .parse()
                .map_err(|e| src.at(Some(span.clone()), format!("engine = {e}")))?,
        },
        preallocate: match tb.provisioning.as_deref() {
            None | Some("thin") => false,
            Some("full") => true,
            Some(other) => {
                return Err(src.at(
                    Some(span),
                    format!("provisioning = {other:?}: use \"thin\" or \"full\""),
                ))
            }
        },
    };
    lun.check().map_err(|m| src.at(Some(span.clone()), m))?;
    Ok(lun)
}

/// No two LUNs of target `name` have one number.
fn unique_numbers(
    src: &Source,
    name: &str,
    luns: &[LunConfig],
    spans: &[Range<usize>],
) -> Result<(), ConfigError> {
    let probe = TargetConfig {
        name: String::new(),
        alias: None,
        luns: luns.to_vec(),
        access: Access::default(),
        chap: TargetChap::Inherit,
    };
    let numbered = probe.numbered();
    for (k, (n, i)) in numbered.iter().enumerate() {
        if numbered[..k].iter().any(|(m, _)| m == n) {
            return Err(src.at(
                spans.get(*i).cloned(),
                format!(
                    "target {:?}: two LUNs are numbered {n}; give each its own number",
                    name
                ),
            ));
        }
    }
    Ok(())
}

/// A target's access rules: `allow`, the older `allow_initiators` and
/// `allow_networks`, and its LUNs' `initiators`/`read_only_initiators`.
fn access(
    src: &Source,
    t: &RawTarget,
    lun_initiators: Vec<Vec<String>>,
    lun_read_only: Vec<Vec<String>>,
) -> Result<Access, ConfigError> {
    let mut access = Access {
        luns: lun_initiators,
        read_only: lun_read_only,
        ..Access::default()
    };
    for r in &t.allow {
        access.rules.push(
            AclRule::parse(r.get_ref())
                .map_err(|e| src.at(Some(r.span()), format!("allow: {e}")))?,
        );
    }
    // The lists of before the rules keep their meaning: a name on
    // the first AND an address on the second.
    let mut names = Vec::new();
    for i in &t.allow_initiators {
        validate_initiator_name(i.get_ref())
            .map_err(|e| src.at(Some(i.span()), format!("allow_initiators: {e}")))?;
        names.push(i.get_ref().clone());
    }
    let mut networks = Vec::new();
    for n in &t.allow_networks {
        networks.push(
            parse_network(n.get_ref())
                .map_err(|e| src.at(Some(n.span()), format!("allow_networks: {e}")))?,
        );
    }
    let old = Access::rules_from_lists(&names, &networks);
    if !names.is_empty() && !networks.is_empty() {
        let (line, _) = line_col(src.text, t.allow_networks[0].span().start);
        let written: Vec<String> = old.iter().map(|r| format!("{:?}", r.to_string())).collect();
        tracing::warn!(
            "{}:{line}: target {}: allow_initiators and allow_networks together admit a listed name only from a listed network; read as allow = [{}]. Write that instead: in allow = [...] each rule admits on its own, so a grant (ethersan ctl acl add) widens access (docs/config.md, access rules)",
            src.origin,
            t.name.get_ref(),
            written.join(", ")
        );
    }
    access.rules.extend(old);
    Ok(access)
}

/// A target's `chap`: inherited, `"none"`, or its own `[target.chap]`.
fn chap(src: &Source, t: &mut RawTarget) -> Result<TargetChap, ConfigError> {
    let chap = match t.chap.take() {
        None => TargetChap::Inherit,
        Some(c) => {
            let span = c.span();
            match c.into_inner() {
                RawTargetChap::Word(w) if w == "none" => TargetChap::None,
                RawTargetChap::Word(w) => {
                    return Err(src.at(
                        Some(span),
                        format!(
                            "chap = {w:?} in target {:?}: use chap = \"none\" (no CHAP for this target) or a [target.chap] table with user and secret",
                            t.name.get_ref()
                        ),
                    ))
                }
                RawTargetChap::Table(c) => {
                    TargetChap::Chap(c.resolve(false, src.base).map_err(|m| {
                        src.at(
                            Some(span),
                            format!("[target.chap] of {:?}: {m}", t.name.get_ref()),
                        )
                    })?)
                }
            }
        }
    };
    Ok(chap)
}
