/* Static pages: the HTML answer of GET / for browsers.  The dashboard
 * (docs/http.md, "Dashboard") is dashboard_html.c, generated from
 * dashboard.html.
 * No page loads external resources. */
#include "http/http_internal.h"

const char lmc_http_index_html[] =
    "<!doctype html>\n"
    "<html><head><meta charset=\"utf-8\"><title>LMCache HTTP API</title></head>\n"
    "<body style=\"font-family:sans-serif;max-width:40em;margin:2em auto\">\n"
    "<h1>LMCache HTTP API</h1>\n"
    "<p>lmcached is running.</p>\n"
    "<ul>\n"
    "<li><a href=\"/dashboard\">Dashboard</a></li>\n"
    "<li><a href=\"/status\">/status</a> (JSON)</li>\n"
    "<li><a href=\"/status/memory-pressure\">/status/memory-pressure</a></li>\n"
    "<li><a href=\"/healthcheck\">/healthcheck</a></li>\n"
    "<li><a href=\"/config\">/config</a></li>\n"
    "<li><a href=\"/metrics\">/metrics</a> (Prometheus)</li>\n"
    "<li><a href=\"/threads\">/threads</a></li>\n"
    "<li><a href=\"/version\">/version</a></li>\n"
    "</ul>\n"
    "</body></html>\n";

/* lmc_http_dashboard_html: dashboard_html.c, generated from dashboard.html. */
