//! The JSON API's types and handlers (`/api/v1/…`): a thin layer over
//! [`ethersan_server::control::Control`]. Every error is a JSON object
//! `{"error": "…"}` with the status that fits (400 bad request, 404 not
//! found, 409 conflict, 500 the server failed).

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ethersan_server::control::{Control, ControlError, LunView, TargetView};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::AdminState;

/// An error answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApiError {
    /// What is wrong and what to do.
    pub error: String,
}

/// An error with its HTTP status.
#[derive(Debug)]
pub struct Failure(pub StatusCode, pub String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(ApiError { error: self.1 })).into_response()
    }
}

impl From<ControlError> for Failure {
    fn from(e: ControlError) -> Self {
        let status = match &e {
            ControlError::NotFound(_) => StatusCode::NOT_FOUND,
            ControlError::Conflict(_) => StatusCode::CONFLICT,
            ControlError::Invalid(_) => StatusCode::BAD_REQUEST,
            ControlError::Server(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ControlError::Save { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure(status, e.to_string())
    }
}

type ApiResult<T> = Result<T, Failure>;

/// Run a control operation (it may open files) off the async workers.
async fn blocking<T: Send + 'static>(
    state: &AdminState,
    f: impl FnOnce(&Control) -> Result<T, ControlError> + Send + 'static,
) -> ApiResult<T> {
    let c = state.control.clone();
    // The request's span (the interface it came through) goes along.
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(|| f(&c)))
        .await
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(Failure::from)
}

/// A target.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Target {
    /// Its iSCSI name.
    pub name: String,
    /// Its alias.
    pub alias: Option<String>,
    /// Its LUNs.
    pub luns: Vec<Lun>,
    /// Its access rules (`NAME`, `ADDR/LEN` or `NAME@ADDR/LEN`); any
    /// admits; none: everyone may log in.
    pub rules: Vec<String>,
    /// What the rules mean, in words.
    pub access: String,
    /// The CHAP user of its own credentials, if it has them (secrets are
    /// never returned).
    pub chap_user: Option<String>,
    /// Sessions logged in to it.
    pub sessions: usize,
}

/// A LUN.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Lun {
    /// Its number.
    pub lun: u64,
    /// What backs it (`file /path …`, `ram …`).
    pub backend: String,
    /// Its capacity in bytes.
    pub size_bytes: u64,
    /// Its logical block size.
    pub block_size: u32,
    /// Write protected.
    pub read_only: bool,
    /// Its WWN (NAA), hex.
    pub naa: Option<String>,
    /// Its serial number.
    pub serial: Option<String>,
}

fn lun(l: &LunView) -> Lun {
    Lun {
        lun: l.lun,
        backend: l.backend.clone(),
        size_bytes: l.size_bytes.unwrap_or(0),
        block_size: l.block_size,
        read_only: l.config.read_only,
        naa: l.naa.clone(),
        serial: l.serial.clone(),
    }
}

fn target(t: &TargetView) -> Target {
    Target {
        name: t.config.name.clone(),
        alias: t.config.alias.clone(),
        luns: t.luns.iter().map(lun).collect(),
        rules: t
            .config
            .access
            .rules
            .iter()
            .map(|r| r.to_string())
            .collect(),
        access: t.config.access.meaning(),
        chap_user: match &t.config.chap {
            ethersan_server::config::TargetChap::Chap(c) => Some(c.initiator.user.clone()),
            _ => None,
        },
        sessions: t.sessions,
    }
}

/// LUN `n` of `target` as it is now.
fn lun_view(c: &Control, target: &str, n: u64) -> Result<LunView, ControlError> {
    c.target(target)?
        .luns
        .into_iter()
        .find(|l| l.lun == n)
        .ok_or_else(|| ControlError::NotFound(format!("target {target} has no LUN {n}")))
}

/// Every target.
#[utoipa::path(get, path = "/api/v1/targets", responses((status = 200, body = Vec<Target>)))]
pub async fn list_targets(State(s): State<AdminState>) -> ApiResult<Json<Vec<Target>>> {
    blocking(&s, |c| Ok(c.targets().iter().map(target).collect()))
        .await
        .map(Json)
}

/// A new target.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NewTarget {
    /// Its iSCSI name.
    pub name: String,
    /// Its alias.
    pub alias: Option<String>,
}

/// Export a new target (with no LUNs yet).
#[utoipa::path(post, path = "/api/v1/targets", request_body = NewTarget,
    responses((status = 201, body = Target), (status = 409, body = ApiError), (status = 400, body = ApiError)))]
pub async fn add_target(
    State(s): State<AdminState>,
    Json(req): Json<NewTarget>,
) -> ApiResult<(StatusCode, Json<Target>)> {
    let t = blocking(&s, move |c| {
        c.add_target(&req.name, req.alias)?;
        c.target(&req.name)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(target(&t))))
}

/// `?force=true`.
#[derive(Debug, Default, Serialize, Deserialize, IntoParams)]
pub struct Force {
    /// Also when sessions use it (they end, or are told the LUN is gone).
    #[serde(default)]
    pub force: bool,
}

/// Stop exporting a target.
#[utoipa::path(delete, path = "/api/v1/targets/{target}", params(("target" = String, Path), Force),
    responses((status = 204), (status = 404, body = ApiError), (status = 409, body = ApiError)))]
pub async fn remove_target(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    Query(f): Query<Force>,
) -> ApiResult<StatusCode> {
    blocking(&s, move |c| c.remove_target(&name, f.force)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// One target's LUNs.
#[utoipa::path(get, path = "/api/v1/targets/{target}/luns", params(("target" = String, Path)),
    responses((status = 200, body = Vec<Lun>), (status = 404, body = ApiError)))]
pub async fn list_luns(
    State(s): State<AdminState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Vec<Lun>>> {
    let t = blocking(&s, move |c| c.target(&name)).await?;
    Ok(Json(t.luns.iter().map(lun).collect()))
}

/// A new LUN.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NewLun {
    /// As `serve --lun`: `PATH[:SIZE][,opts]` or `ram:SIZE` (a relative
    /// path is taken from the server's working directory).
    pub spec: String,
    /// Its number (default: the lowest free).
    pub lun: Option<u64>,
}

/// Add a LUN to a running target.
#[utoipa::path(post, path = "/api/v1/targets/{target}/luns", params(("target" = String, Path)), request_body = NewLun,
    responses((status = 201, body = Lun), (status = 400, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError)))]
pub async fn add_lun(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    Json(req): Json<NewLun>,
) -> ApiResult<(StatusCode, Json<Lun>)> {
    let l = blocking(&s, move |c| {
        let n = c.add_lun(&name, &req.spec, req.lun)?;
        lun_view(c, &name, n)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(lun(&l))))
}

/// Remove a LUN from a running target.
#[utoipa::path(delete, path = "/api/v1/targets/{target}/luns/{lun}", params(("target" = String, Path), ("lun" = u64, Path), Force),
    responses((status = 204), (status = 404, body = ApiError), (status = 409, body = ApiError)))]
pub async fn remove_lun(
    State(s): State<AdminState>,
    Path((name, n)): Path<(String, u64)>,
    Query(f): Query<Force>,
) -> ApiResult<StatusCode> {
    blocking(&s, move |c| c.remove_lun(&name, n, f.force)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A new size.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Resize {
    /// Bytes, or a number with K, M, G, T (`"2G"`).
    pub size: String,
}

/// Resize a file LUN while it serves.
#[utoipa::path(put, path = "/api/v1/targets/{target}/luns/{lun}/size", params(("target" = String, Path), ("lun" = u64, Path)), request_body = Resize,
    responses((status = 200, body = Lun), (status = 400, body = ApiError), (status = 404, body = ApiError)))]
pub async fn resize_lun(
    State(s): State<AdminState>,
    Path((name, n)): Path<(String, u64)>,
    Json(req): Json<Resize>,
) -> ApiResult<Json<Lun>> {
    let l = blocking(&s, move |c| {
        let bytes = ethersan_server::config::parse_size(&req.size)
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        c.resize_lun(&name, n, bytes)?;
        lun_view(c, &name, n)
    })
    .await?;
    Ok(Json(lun(&l)))
}

/// A target's access rules.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Acl {
    /// The rules; an initiator may log in when any admits it.
    pub rules: Vec<AclRule>,
    /// No rules: every initiator from any address may log in.
    pub open: bool,
    /// What the rules mean, in words.
    pub access: String,
}

/// One access rule.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AclRule {
    /// As written: `NAME`, `ADDR/LEN` or `NAME@ADDR/LEN`.
    pub rule: String,
    /// What it admits, in words.
    pub meaning: String,
}

/// Who may log in to a target (no rules: everyone).
#[utoipa::path(get, path = "/api/v1/targets/{target}/acl", params(("target" = String, Path)),
    responses((status = 200, body = Acl), (status = 404, body = ApiError)))]
pub async fn list_acl(
    State(s): State<AdminState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Acl>> {
    let t = blocking(&s, move |c| c.target(&name)).await?;
    let access = &t.config.access;
    Ok(Json(Acl {
        rules: access
            .rules
            .iter()
            .map(|r| AclRule {
                rule: r.to_string(),
                meaning: r.meaning(),
            })
            .collect(),
        open: access.is_open(),
        access: access.meaning(),
    }))
}

/// One access rule to add or remove.
#[derive(Debug, Serialize, Deserialize, ToSchema, IntoParams)]
pub struct Grant {
    /// An initiator name (`iqn.…`), a network (`ADDR/LEN`) or a name from
    /// a network (`NAME@ADDR/LEN`).
    pub entry: String,
}

/// What a grant or a revoke did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AclChanged {
    /// The rule added or removed.
    pub rule: String,
    /// What the target's rules mean now.
    pub access: String,
    /// Set when the change narrowed access (or opened the target): what
    /// it did and the sessions it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

impl From<ethersan_server::control::AclChange> for AclChanged {
    fn from(c: ethersan_server::control::AclChange) -> Self {
        AclChanged {
            rule: c.rule,
            access: c.meaning,
            warning: c.warning,
        }
    }
}

/// Add an access rule: any rule admits, so this widens access (the first
/// rule of an open target narrows it: the answer's warning says so).
#[utoipa::path(post, path = "/api/v1/targets/{target}/acl", params(("target" = String, Path)), request_body = Grant,
    responses((status = 200, body = AclChanged), (status = 400, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError)))]
pub async fn grant(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    Json(req): Json<Grant>,
) -> ApiResult<Json<AclChanged>> {
    let c = blocking(&s, move |c| c.grant(&name, &req.entry)).await?;
    Ok(Json(c.into()))
}

/// Remove an access rule (the sessions only it admitted end; the
/// answer's warning names them).
#[utoipa::path(delete, path = "/api/v1/targets/{target}/acl", params(("target" = String, Path), Grant),
    responses((status = 200, body = AclChanged), (status = 404, body = ApiError)))]
pub async fn revoke(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    Query(req): Query<Grant>,
) -> ApiResult<Json<AclChanged>> {
    let c = blocking(&s, move |c| c.revoke(&name, &req.entry)).await?;
    Ok(Json(c.into()))
}

/// CHAP credentials (write-only).
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Chap {
    /// One target's own credentials; absent: the global ones.
    pub target: Option<String>,
    /// CHAP_N.
    pub user: String,
    /// The secret (12 to 255 bytes); never returned.
    pub secret: String,
}

impl std::fmt::Debug for Chap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chap")
            .field("target", &self.target)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Require CHAP (for logins from now on).
#[utoipa::path(put, path = "/api/v1/chap", request_body = Chap,
    responses((status = 204), (status = 400, body = ApiError), (status = 404, body = ApiError)))]
pub async fn set_chap(State(s): State<AdminState>, Json(req): Json<Chap>) -> ApiResult<StatusCode> {
    blocking(&s, move |c| {
        c.set_chap(req.target.as_deref(), &req.user, req.secret.as_bytes())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `?target=IQN`.
#[derive(Debug, Default, Serialize, Deserialize, IntoParams)]
pub struct TargetQuery {
    /// One target; absent: the global setting.
    pub target: Option<String>,
}

/// Stop requiring CHAP.
#[utoipa::path(delete, path = "/api/v1/chap", params(TargetQuery),
    responses((status = 204), (status = 404, body = ApiError)))]
pub async fn clear_chap(
    State(s): State<AdminState>,
    Query(q): Query<TargetQuery>,
) -> ApiResult<StatusCode> {
    blocking(&s, move |c| c.clear_chap(q.target.as_deref())).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Command counters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct Counters {
    /// Read commands.
    pub reads: u64,
    /// Write commands.
    pub writes: u64,
    /// Other commands.
    pub others: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Commands that failed (CHECK CONDITION or another non-GOOD status).
    pub errors: u64,
}

impl From<&ethersan_core::counters::Snapshot> for Counters {
    fn from(s: &ethersan_core::counters::Snapshot) -> Self {
        Counters {
            reads: s.reads,
            writes: s.writes,
            others: s.others,
            read_bytes: s.read_bytes,
            write_bytes: s.write_bytes,
            errors: s.errors.iter().sum::<u64>() + s.other_failures,
        }
    }
}

/// A live session (one connection each: MaxConnections is 1).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Session {
    /// Its id (for `DELETE /api/v1/sessions/{id}`).
    pub id: u64,
    /// The target (`null`: a discovery session).
    pub target: Option<String>,
    /// The initiator's name.
    pub initiator: String,
    /// The initiator's alias.
    pub initiator_alias: Option<String>,
    /// ISID, hex.
    pub isid: String,
    /// TSIH.
    pub tsih: u16,
    /// Where the initiator connected from.
    pub address: Option<String>,
    /// `iscsi` or `native`.
    pub transport: Option<String>,
    /// Seconds since the Unix epoch when it started.
    pub started: Option<u64>,
    /// What login negotiated.
    pub parameters: BTreeMap<String, String>,
    /// Its commands.
    pub counters: Counters,
}

fn session(v: &ethersan_server::registry::SessionView) -> Session {
    let d = v.details.as_ref();
    let mut parameters = BTreeMap::new();
    if let Some(d) = d {
        let p = &d.params;
        let yn = |b: bool| if b { "Yes" } else { "No" }.to_string();
        let dg = |b: bool| if b { "CRC32C" } else { "None" }.to_string();
        parameters.insert("HeaderDigest".into(), dg(p.header_digest));
        parameters.insert("DataDigest".into(), dg(p.data_digest));
        parameters.insert("InitialR2T".into(), yn(p.initial_r2t));
        parameters.insert("ImmediateData".into(), yn(p.immediate_data));
        parameters.insert(
            "MaxRecvDataSegmentLength".into(),
            p.max_recv_data_segment_length.to_string(),
        );
        parameters.insert(
            "MaxXmitDataSegmentLength".into(),
            p.max_send_data_segment_length.to_string(),
        );
        parameters.insert("MaxBurstLength".into(), p.max_burst_length.to_string());
        parameters.insert("FirstBurstLength".into(), p.first_burst_length.to_string());
        parameters.insert(
            "MaxOutstandingR2T".into(),
            p.max_outstanding_r2t.to_string(),
        );
        parameters.insert("MaxConnections".into(), p.max_connections.to_string());
        parameters.insert(
            "ErrorRecoveryLevel".into(),
            p.error_recovery_level.to_string(),
        );
        if let Some(l) = d.channel_level {
            parameters.insert("ChannelSecurity".into(), l.to_string());
        }
    }
    Session {
        id: v.id,
        target: v.target.clone(),
        initiator: v.initiator.clone(),
        initiator_alias: d.and_then(|d| d.params.initiator_alias.clone()),
        isid: v.isid.iter().map(|b| format!("{b:02x}")).collect(),
        tsih: v.tsih,
        address: d.map(|d| d.address.clone()),
        transport: d.map(|d| d.transport.to_string()),
        started: d.and_then(|d| {
            d.started
                .duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|t| t.as_secs())
        }),
        parameters,
        counters: d
            .map(|d| Counters::from(&d.counters.snapshot()))
            .unwrap_or_default(),
    }
}

/// Every live session.
#[utoipa::path(get, path = "/api/v1/sessions", responses((status = 200, body = Vec<Session>)))]
pub async fn list_sessions(State(s): State<AdminState>) -> Json<Vec<Session>> {
    Json(s.control.sessions().iter().map(session).collect())
}

/// End a session (the initiator may log in again).
#[utoipa::path(delete, path = "/api/v1/sessions/{id}", params(("id" = u64, Path)),
    responses((status = 204), (status = 404, body = ApiError)))]
pub async fn logout(State(s): State<AdminState>, Path(id): Path<u64>) -> ApiResult<StatusCode> {
    s.control.logout(id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Look at every LUN's backing store size again (initiators are told of
/// the changes).
#[utoipa::path(post, path = "/api/v1/rescan", responses((status = 204)))]
pub async fn rescan(State(s): State<AdminState>) -> ApiResult<StatusCode> {
    blocking(&s, |c| {
        c.rescan();
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Where to save.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct Save {
    /// An absolute path on the server; absent: the file the server was
    /// started with (`--config`), else `ethersan.toml` in its data
    /// directory.
    pub path: Option<String>,
}

/// What was saved.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Saved {
    /// The file written (or found to hold the running configuration).
    pub path: String,
    /// Where the file's previous version was kept (`FILE.bak`), if it
    /// existed and changed.
    pub backup: Option<String>,
    /// Whether the file was written (false: it said this already).
    pub written: bool,
    /// The existing file was edited where it differs, its comments and
    /// layout kept (false: written whole).
    pub edited: bool,
    /// What changed in the file, one line each.
    pub changes: Vec<String>,
    /// Why an existing file was written whole instead of edited.
    pub note: Option<String>,
}

/// Write the running configuration as TOML (atomically, mode 0600): an
/// existing configuration file is edited where it differs and its
/// previous version kept as `FILE.bak`.
#[utoipa::path(post, path = "/api/v1/save", request_body = Save,
    responses((status = 200, body = Saved), (status = 400, body = ApiError), (status = 500, body = ApiError)))]
pub async fn save(State(s): State<AdminState>, Json(req): Json<Save>) -> ApiResult<Json<Saved>> {
    if let Some(p) = &req.path {
        if !std::path::Path::new(p).is_absolute() {
            return Err(Failure(
                StatusCode::BAD_REQUEST,
                format!("{p:?} is not an absolute path: the server does not share your working directory"),
            ));
        }
    }
    let r = blocking(&s, move |c| {
        c.save(req.path.as_deref().map(std::path::Path::new))
    })
    .await?;
    Ok(Json(Saved {
        path: r.path.display().to_string(),
        backup: r.backup.map(|b| b.display().to_string()),
        written: r.written,
        edited: r.edited,
        changes: r.changes,
        note: r.note,
    }))
}

/// A portal.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Portal {
    /// The address it listens on, `ADDR:PORT`.
    pub address: String,
    /// The address SendTargets announces for it, if another.
    pub advertise: Option<String>,
    /// Where initiators reach it (answered, ignored in a request): the
    /// advertised address, else the address itself, or for a wildcard
    /// portal (`0.0.0.0`, `[::]`) this host's addresses, as SendTargets
    /// answers a connection that does not say which one it reached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reachable: Vec<String>,
}

impl From<&ethersan_server::portals::PortalInfo> for Portal {
    fn from(p: &ethersan_server::portals::PortalInfo) -> Portal {
        Portal {
            address: p.address.to_string(),
            advertise: p.advertise.map(|a| a.to_string()),
            reachable: p.announced(None).iter().map(|a| a.to_string()).collect(),
        }
    }
}

/// The portals listening now.
#[utoipa::path(get, path = "/api/v1/portals", responses((status = 200, body = Vec<Portal>)))]
pub async fn list_portals(State(s): State<AdminState>) -> Json<Vec<Portal>> {
    Json(s.control.portals().iter().map(Portal::from).collect())
}

fn socket_addr(what: &str, s: &str) -> ApiResult<std::net::SocketAddr> {
    s.trim().parse().map_err(|_| {
        Failure(
            StatusCode::BAD_REQUEST,
            format!("{what} {s:?} is not ADDR:PORT (an IP address and a port, IPv6 as [::1]:3260)"),
        )
    })
}

/// Listen on a new portal now.
#[utoipa::path(post, path = "/api/v1/portals", request_body = Portal,
    responses((status = 201, body = Portal), (status = 400, body = ApiError), (status = 409, body = ApiError), (status = 422, body = ApiError)))]
pub async fn add_portal(
    State(s): State<AdminState>,
    Json(req): Json<Portal>,
) -> ApiResult<(StatusCode, Json<Portal>)> {
    let address = socket_addr("address", &req.address)?;
    let advertise = req
        .advertise
        .as_deref()
        .map(|a| socket_addr("advertise", a))
        .transpose()?;
    let bound = blocking(&s, move |c| c.add_portal(address, advertise)).await?;
    Ok((
        StatusCode::CREATED,
        Json(Portal::from(&ethersan_server::portals::PortalInfo {
            address: bound,
            advertise,
        })),
    ))
}

/// Stop listening on a portal (sessions through it go on).
#[utoipa::path(delete, path = "/api/v1/portals/{address}", params(("address" = String, Path)),
    responses((status = 204), (status = 400, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError)))]
pub async fn remove_portal(
    State(s): State<AdminState>,
    Path(address): Path<String>,
) -> ApiResult<StatusCode> {
    let address = socket_addr("address", &address)?;
    blocking(&s, move |c| c.remove_portal(address)).await?;
    Ok(StatusCode::NO_CONTENT)
}
