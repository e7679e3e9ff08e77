// Request-body classification lives in FleetIngestRequests, which has no HTTP dependency (fuzzed on its own).
@_exported import FleetIngestRequests
