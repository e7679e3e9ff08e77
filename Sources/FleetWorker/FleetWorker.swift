// FleetWorker
