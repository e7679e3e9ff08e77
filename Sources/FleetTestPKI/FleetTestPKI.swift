// FleetTestPKI
