//! The built-in catalog of vendor services (DESIGN §11) and the `@build`
//! passthrough preset. Used when routes come from `--services` instead of a
//! config file.

/// One catalog service: a name and the (host, path prefixes) it claims.
/// An empty prefix list claims the whole host.
pub struct CatalogService {
    pub name: &'static str,
    pub claims: &'static [(&'static str, &'static [&'static str])],
}

/// Every service veris knows how to route without a config file.
pub const CATALOG: &[CatalogService] = &[
    CatalogService {
        name: "stripe",
        claims: &[("api.stripe.com", &[]), ("files.stripe.com", &[])],
    },
    CatalogService {
        name: "google-calendar",
        claims: &[("www.googleapis.com", &["/calendar/v3"])],
    },
    CatalogService {
        name: "google-drive",
        claims: &[(
            "www.googleapis.com",
            &[
                "/drive/v3",
                "/upload/drive/v3/files",
                "/resumable/upload/drive/v3/files",
            ],
        )],
    },
    CatalogService {
        name: "google-gmail",
        claims: &[("gmail.googleapis.com", &[])],
    },
    CatalogService {
        name: "google-identity",
        claims: &[
            (
                "oauth2.googleapis.com",
                &["/token", "/revoke", "/tokeninfo"],
            ),
            (
                "accounts.google.com",
                &["/o/oauth2/v2/auth", "/.well-known/openid-configuration"],
            ),
            ("openidconnect.googleapis.com", &["/v1/userinfo"]),
            (
                "www.googleapis.com",
                &[
                    "/oauth2/v1/certs",
                    "/oauth2/v2",
                    "/oauth2/v3",
                    "/userinfo/v2/me",
                ],
            ),
        ],
    },
    CatalogService {
        name: "hubspot",
        claims: &[("api.hubapi.com", &[])],
    },
    CatalogService {
        name: "notion",
        claims: &[("api.notion.com", &[])],
    },
    CatalogService {
        name: "linear",
        claims: &[("api.linear.app", &[])],
    },
    CatalogService {
        name: "airtable",
        claims: &[("api.airtable.com", &[])],
    },
    CatalogService {
        name: "asana",
        claims: &[("app.asana.com", &[])],
    },
    CatalogService {
        name: "jira",
        claims: &[("api.atlassian.com", &[])],
    },
    CatalogService {
        name: "salesforce",
        claims: &[(
            "login.salesforce.com",
            &["/services/oauth2/authorize", "/services/oauth2/token"],
        )],
    },
    CatalogService {
        name: "microsoft-graph",
        claims: &[("graph.microsoft.com", &["/v1.0"])],
    },
    CatalogService {
        name: "microsoft-identity",
        claims: &[
            ("login.microsoftonline.com", &[]),
            ("graph.microsoft.com", &["/oidc/userinfo"]),
        ],
    },
    CatalogService {
        name: "github",
        claims: &[("api.github.com", &[])],
    },
    CatalogService {
        name: "sendgrid",
        claims: &[("api.sendgrid.com", &[])],
    },
];

/// Package registries a build needs; `@build` in `allow_passthrough` expands to these.
pub const BUILD_PRESET: &[&str] = &[
    "repo.maven.apache.org",
    "repo1.maven.org",
    "services.gradle.org",
    "downloads.gradle.org",
    "plugins.gradle.org",
    "plugins-artifacts.gradle.org",
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    "pypi.org",
    "files.pythonhosted.org",
    "proxy.golang.org",
    "sum.golang.org",
    "crates.io",
    "index.crates.io",
    "static.crates.io",
    "rubygems.org",
    "index.rubygems.org",
    "api.nuget.org",
    "repo.packagist.org",
];

/// Looks a catalog service up by name.
pub fn lookup(name: &str) -> Option<&'static CatalogService> {
    CATALOG.iter().find(|s| s.name == name)
}

/// Names of every catalog service, in catalog order.
pub fn names() -> Vec<&'static str> {
    CATALOG.iter().map(|s| s.name).collect()
}
