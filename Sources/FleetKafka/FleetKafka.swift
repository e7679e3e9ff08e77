// FleetKafka
