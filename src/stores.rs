//! Object stores named by URL — `s3://`, `gs://`, `az://` (and `abfs://`, `azure://`),
//! `http(s)://` — built on first use from the environment, as datafusion-cli does, through the
//! `object_store` crate's builders: credentials, region and endpoint come from the variables each
//! builder reads (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP`; `GOOGLE_SERVICE_ACCOUNT`, `GOOGLE_APPLICATION_CREDENTIALS`;
//! `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`, …).
//!
//! Without credentials in the environment a store sends unsigned requests (public buckets work,
//! private ones answer "access denied" for the URL): the builders would otherwise ask the cloud's
//! instance-metadata service, which off that cloud retries for minutes before failing. On a cloud
//! instance whose role grants access, set `AWS_SKIP_SIGNATURE=false` (or `GOOGLE_SKIP_SIGNATURE`,
//! `AZURE_SKIP_SIGNATURE`) to use it.

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::{ClientOptions, ObjectStore};
use url::Url;

/// The URL schemes [`store_for_url`] builds stores for.
pub const REMOTE_SCHEMES: [&str; 8] = ["s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "http"];

/// Whether `url` names a remote object store this module can build (https included).
pub fn is_remote(url: &Url) -> bool {
    REMOTE_SCHEMES.contains(&url.scheme()) || url.scheme() == "https"
}

/// The store for `url`'s bucket (container, host), built from the environment.
pub fn store_for_url(url: &Url) -> Result<Arc<dyn ObjectStore>> {
    let failed = |e: object_store::Error| {
        DataFusionError::Configuration(format!("cannot open the object store of '{url}': {e}"))
    };
    let anonymous = |variable: &str, credentials: &[&str]| {
        std::env::var_os(variable).is_none() && credentials.iter().all(|c| std::env::var_os(c).is_none())
    };
    let store: Arc<dyn ObjectStore> = match url.scheme() {
        "s3" | "s3a" => {
            let unsigned = anonymous(
                "AWS_SKIP_SIGNATURE",
                &[
                    "AWS_ACCESS_KEY_ID",
                    "AWS_WEB_IDENTITY_TOKEN_FILE",
                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                ],
            );
            let mut builder = AmazonS3Builder::from_env().with_url(url.as_str());
            if unsigned {
                builder = builder.with_skip_signature(true);
            }
            Arc::new(builder.build().map_err(failed)?)
        }
        "gs" => {
            let adc = std::env::var_os("HOME")
                .map(|home| std::path::Path::new(&home).join(".config/gcloud/application_default_credentials.json"))
                .is_some_and(|p| p.exists());
            let unsigned = !adc
                && anonymous(
                    "GOOGLE_SKIP_SIGNATURE",
                    &["GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_KEY", "GOOGLE_APPLICATION_CREDENTIALS"],
                );
            let mut builder = GoogleCloudStorageBuilder::from_env().with_url(url.as_str());
            if unsigned {
                builder = builder.with_skip_signature(true);
            }
            Arc::new(builder.build().map_err(failed)?)
        }
        "az" | "abfs" | "abfss" | "azure" => {
            let unsigned = anonymous(
                "AZURE_SKIP_SIGNATURE",
                &[
                    "AZURE_STORAGE_ACCOUNT_KEY",
                    "AZURE_STORAGE_ACCESS_KEY",
                    "AZURE_STORAGE_SAS_KEY",
                    "AZURE_STORAGE_SAS_TOKEN",
                    "AZURE_STORAGE_TOKEN",
                    "AZURE_CLIENT_SECRET",
                    "AZURE_FEDERATED_TOKEN_FILE",
                    "AZURE_STORAGE_USE_EMULATOR",
                ],
            );
            let mut builder = MicrosoftAzureBuilder::from_env().with_url(url.as_str());
            if unsigned {
                builder = builder.with_skip_signature(true);
            }
            Arc::new(builder.build().map_err(failed)?)
        }
        "http" | "https" => {
            let origin = &url[..url::Position::BeforePath];
            // The URL's own scheme says whether plain HTTP is wanted.
            let options = ClientOptions::new().with_allow_http(url.scheme() == "http");
            Arc::new(HttpBuilder::new().with_url(origin).with_client_options(options).build().map_err(failed)?)
        }
        other => {
            return Err(DataFusionError::Configuration(format!(
                "no object store for '{url}': the scheme '{other}' is not one of file, {}, https",
                REMOTE_SCHEMES.join(", ")
            )));
        }
    };
    Ok(store)
}

/// DataFusion's registry, which also builds a store for a remote URL the first time one is named
/// ([`store_for_url`]) and keeps it for the session.
#[derive(Debug, Default)]
pub struct RemoteStoreRegistry {
    inner: DefaultObjectStoreRegistry,
}

impl RemoteStoreRegistry {
    pub fn new() -> Self {
        Self::default()
    }
}

impl ObjectStoreRegistry for RemoteStoreRegistry {
    fn register_store(&self, url: &Url, store: Arc<dyn ObjectStore>) -> Option<Arc<dyn ObjectStore>> {
        self.inner.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        if let Ok(store) = self.inner.get_store(url) {
            return Ok(store);
        }
        if !is_remote(url) {
            return Err(DataFusionError::Configuration(format!(
                "no object store for '{url}': the scheme '{}' is not one of file, {}, https",
                url.scheme(),
                REMOTE_SCHEMES.join(", ")
            )));
        }
        let store = store_for_url(url)?;
        self.inner.register_store(url, store.clone());
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::datasource::object_store::ObjectStoreRegistry;
    use url::Url;

    use super::RemoteStoreRegistry;

    #[test]
    fn unknown_schemes_and_bad_urls_are_named() {
        let registry = RemoteStoreRegistry::new();
        let e = registry.get_store(&Url::parse("ftp://host/points.parquet").unwrap()).unwrap_err().to_string();
        assert!(e.contains("ftp://host/points.parquet") && e.contains("'ftp'"), "{e}");
        // A local path still works (DataFusion's own file store).
        assert!(registry.get_store(&Url::parse("file:///tmp").unwrap()).is_ok());
        // A store is built once and kept.
        let url = Url::parse("s3://bucket/points.parquet").unwrap();
        let first = registry.get_store(&url).unwrap();
        let again = registry.get_store(&Url::parse("s3://bucket/other.csv").unwrap()).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
    }
}
