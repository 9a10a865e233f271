//! The URI a reconcile opens for a host: the LibvirtCluster's URI, with the
//! files of its `credentialsRef` Secret named in it (see
//! [`capl_host::credentials`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::context::Context;
use super::error::Error;
use crate::api::conditions::reasons;

/// Why a host cannot be opened with its credentials: a condition to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    pub reason: &'static str,
    pub message: String,
    /// Retry on a timer (the Secret may appear); otherwise wait for a change.
    pub transient: bool,
}

/// The URI to open for `uri` with the credentials of Secret `secret` (in
/// `namespace`), named by `owner` (e.g. "LibvirtCluster c1"). Without a
/// Secret, `uri` itself. While `deleting`, a Secret that is gone is replaced
/// by the credentials last read from it, when the manager still has them.
pub async fn connection_uri(
    ctx: &Context,
    namespace: &str,
    uri: &str,
    secret: Option<&str>,
    owner: &str,
    deleting: bool,
) -> Result<Result<String, Unusable>, Error> {
    let Some(secret) = secret else { return Ok(Ok(uri.to_string())) };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(found) = api.get_opt(secret).await? else {
        if deleting && let Some(last) = ctx.credentials.last(uri, namespace, secret) {
            return Ok(Ok(last));
        }
        return Ok(Err(Unusable {
            reason: reasons::CREDENTIALS_NOT_FOUND,
            message: format!(
                "{owner}: Secret {namespace}/{secret} named by credentialsRef does not exist: create it with the \
                 credentials for {uri} (see the book, \"Credentials and the URI policy\")"
            ),
            transient: true,
        }));
    };
    let data: BTreeMap<String, Vec<u8>> =
        found.data.unwrap_or_default().into_iter().map(|(key, value)| (key, value.0)).collect();
    // Files are written and synced: on the blocking pool, not a runtime worker.
    let store = ctx.credentials.clone();
    let (uri, namespace, secret) = (uri.to_string(), namespace.to_string(), secret.to_string());
    let applied = tokio::task::spawn_blocking(move || store.apply(&uri, &namespace, &secret, &data))
        .await
        .unwrap_or_else(|e| Err(format!("writing the credentials did not complete: {e}").into()));
    Ok(applied.map_err(|refused| Unusable {
        reason: reasons::INVALID_CREDENTIALS,
        message: format!("{owner}: {}", refused.message),
        transient: refused.retry_later,
    }))
}

/// The URI to open for `host` of a LibvirtCluster, named by `owner`: refused
/// by the manager's URI policy, or [`connection_uri`] with the host's
/// credentials Secret (while `deleting`, the credentials last read when the
/// Secret is gone: `kubectl delete -f` deletes both at once).
pub async fn host_connection_uri(
    ctx: &Context,
    namespace: &str,
    host: &crate::api::ClusterHost,
    owner: &str,
    deleting: bool,
) -> Result<Result<String, Unusable>, Error> {
    if let Err(message) = ctx.settings.uri_policy.check(&host.uri, namespace) {
        // Never connected: opening this URI is what the policy refuses.
        return Ok(Err(Unusable { reason: reasons::URI_NOT_ALLOWED, message, transient: false }));
    }
    connection_uri(ctx, namespace, &host.uri, host.credentials.as_deref(), owner, deleting).await
}

/// `message` with the URI that was opened written as the URI the user gave:
/// the credential file parameters are the manager's business.
pub fn as_user_wrote_it(message: String, opened: &str, uri: &str) -> String {
    if opened == uri { message } else { message.replace(opened, uri) }
}
