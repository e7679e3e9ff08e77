// FleetSink
