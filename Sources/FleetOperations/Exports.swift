// Configuration (file < env < flags) lives in FleetConfig, which has no HTTP dependency (fuzzed on its own).
@_exported import FleetConfig
