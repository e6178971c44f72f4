"""Every label, annotation and data key the pool reads or writes, in one place.

They are Theia Cloud's exact keys: an operator that spelt one differently would not find (and
so would duplicate or delete) what the Java operator created.
"""

from __future__ import annotations

GROUP = "theia.cloud"
APPDEF_API_VERSION = "theia.cloud/v1beta11"
APPDEF_KIND = "AppDefinition"
APPDEF_PLURAL = "appdefinitions"
SESSION_API_VERSION = "theia.cloud/v1beta8"
SESSION_KIND = "Session"
SESSION_PLURAL = "sessions"
# A Session's route (session-lifecycle §1): Gateway API's HTTPRoute, named after the Session's uid.
ROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
ROUTE_KIND = "HTTPRoute"
ROUTE_SUFFIX = "-route"
# warmpool's own kind: a scheduled pool size for one AppDefinition (warmpool.pool.schedule).
SCHEDULE_GROUP = "warmpool.io"
SCHEDULE_API_VERSION = "warmpool.io/v1alpha1"
SCHEDULE_KIND = "PoolSchedule"
SCHEDULE_PLURAL = "poolschedules"

# Labels on pool objects.
LABEL_APP = "app"
LABEL_GENERATION = "theia-cloud.io/appdefinition-generation"
LABEL_SERVICE_TYPE = "theia-cloud.io/service-type"
SERVICE_TYPE_INTERNAL = "internal"
LABEL_TEMPLATE_PURPOSE = "theia-cloud.io/template-purpose"
PURPOSE_PROXY = "proxy"
PURPOSE_EMAILS = "emails"

# Session labels, on both Services while an instance is claimed.
LABEL_SESSION = "theia-cloud.io/session"
LABEL_SESSION_UUID = "theia-cloud.io/session-uuid"
LABEL_USER = "theia-cloud.io/user"
LABEL_APP_DEFINITION = "theia-cloud.io/app-definition"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
SESSION_LABEL_KEYS = (
    LABEL_SESSION,
    LABEL_SESSION_UUID,
    LABEL_USER,
    LABEL_APP_DEFINITION,
    LABEL_COMPONENT,
    LABEL_PART_OF,
)

# Annotations.
ANNOTATION_INSTANCE_ID = "theia-cloud.io/instance-id"
ANNOTATION_START_STRATEGY = "theia-cloud.io/session-start-strategy"
START_STRATEGY_EAGER = "eager"
# The EduIDE line's Java operator, with no free instance, starts a Session "lazily" (a Deployment
# of its own, owned by the Session) and annotates it so (EagerWithLazyFallbackSessionHandler).
START_STRATEGY_LAZY_FALLBACK = "lazy-fallback"
ANNOTATION_REFRESH = "theia-cloud.io/eager-start-refresh"
# warmpool's own: the fence of the lease under which an object was last written.
ANNOTATION_FENCE = "warmpool.io/fence"
# warmpool's own: a hash of the object's free-state shape, without generation, holder or owners.
ANNOTATION_SHAPE = "warmpool.io/shape"
# warmpool's own, on a claimed external Service: "<Session uid>/<digest of its spec.user>" as
# the deciding write made it, so a Session whose user changed since is told from its holder.
ANNOTATION_CLAIMED_FOR = "warmpool.io/claimed-for"

# ConfigMap data keys.
EMAILS_KEY = "authenticated-emails-list"
PROXY_CONFIG_KEY = "oauth2-proxy.cfg"
NAMESPACE_PROXY_TEMPLATE = "oauth2-proxy-config"

# Ports.
OAUTH2_PROXY_PORT = 5000
INTERNAL_PORT = 3001

# Session status values.
STATUS_NEW = "NEW"
STATUS_HANDLING = "HANDLING"
STATUS_HANDLED = "HANDLED"
STATUS_ERROR = "ERROR"
