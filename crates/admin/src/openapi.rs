//! The OpenAPI description, generated from the handlers' annotations;
//! `docs/openapi.json` is this document (a test keeps them equal:
//! `ethersan ctl openapi > docs/openapi.json` writes it anew).

use axum::Json;
use utoipa::OpenApi;

/// The API's description.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "ethersan management API",
        description = "Change a running ethersan server: targets, LUNs, grants, CHAP, sessions; save its configuration."
    ),
    paths(
        crate::api::list_targets,
        crate::api::add_target,
        crate::api::remove_target,
        crate::api::list_luns,
        crate::api::add_lun,
        crate::api::remove_lun,
        crate::api::resize_lun,
        crate::api::list_acl,
        crate::api::grant,
        crate::api::revoke,
        crate::api::set_chap,
        crate::api::clear_chap,
        crate::api::list_portals,
        crate::api::add_portal,
        crate::api::remove_portal,
        crate::api::list_sessions,
        crate::api::logout,
        crate::api::rescan,
        crate::api::save,
    ),
    components(schemas(
        crate::api::ApiError,
        crate::api::Target,
        crate::api::Lun,
        crate::api::NewTarget,
        crate::api::NewLun,
        crate::api::Resize,
        crate::api::Acl,
        crate::api::AclRule,
        crate::api::AclChanged,
        crate::api::Grant,
        crate::api::Chap,
        crate::api::Counters,
        crate::api::Session,
        crate::api::Portal,
        crate::api::Save,
        crate::api::Saved,
    ))
)]
pub struct ApiDoc;

/// The description as pretty JSON (what docs/openapi.json holds).
pub fn document() -> String {
    let mut doc = ApiDoc::openapi();
    // The version of the API, not of the crate that generated it.
    doc.info.version = "1".into();
    doc.info.license = None;
    doc.info.contact = None;
    let mut s = doc.to_pretty_json().unwrap_or_default();
    s.push('\n');
    s
}

/// `GET /api/openapi.json`.
pub(crate) async fn serve() -> Json<serde_json::Value> {
    Json(serde_json::from_str(&document()).unwrap_or_default())
}
