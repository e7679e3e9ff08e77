// FleetOperations
