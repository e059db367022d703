@0xd2b94ed3f3f1279e;

# The messages of a robot / vehicle software stack. One root struct, Event, carries a
# timestamp, a validity flag and exactly one service's payload (the union). Every msgq
# service of the registry (schemas/services.py) is one field of that union, with the
# same name.
#
# Units are SI (m, s, m/s, m/s^2, rad, rad/s, kg, N, Pa, K, V, A, W, T) unless the field
# name says otherwise (...Deg, ...Pct, ...Ns, ...Ms, ...Celsius, ...Bytes). Times named
# ...MonoTime / ...Ns are CLOCK_MONOTONIC nanoseconds unless named ...WallTime...
#
# Evolving this file without breaking old logs: see "Evolving the schema" in README.md.
# In short: only add fields (next ordinal), never renumber, remove or retype one; retire a
# field by renaming it ...DEPRECATED; add union members at the end.

using Custom = import "custom.capnp";

# --- shared pieces -----------------------------------------------------------------

# A 3-vector (x forward, y left, z up in the body frame unless a field says otherwise).
struct Vector3 {
  x @0 :Float32;
  y @1 :Float32;
  z @2 :Float32;
}

# A 3-vector with its 1-sigma uncertainty per axis, in the same unit.
struct Measurement3 {
  value @0 :Vector3;
  std @1 :Vector3;
  valid @2 :Bool;
}

# One inertial or magnetic sensor sample.
struct SensorSample {
  # Sensor time of the sample (CLOCK_MONOTONIC ns).
  timestampNs @0 :UInt64;
  # Gyroscope: rad/s. Accelerometer: m/s^2. Magnetometer: T (tesla).
  value @1 :Vector3;
  # Temperature of the sensor die when the sample was taken.
  dieTemperatureCelsius @2 :Float32;
  source @3 :Source;
  # Chip-specific status bits, 0 when healthy.
  status @4 :UInt32;

  enum Source {
    unknown @0;
    imu0 @1;
    imu1 @2;
    magnetometer0 @3;
  }
}

# --- the log itself ----------------------------------------------------------------

# First event of every log segment.
struct LogStart {
  # Version of msgq that wrote the log.
  version @0 :Text;
  # Hex fingerprint of the schema files the log was written with.
  schemaFingerprint @1 :Text;
  # Wall-clock time the segment started (ns since the Unix epoch, UTC).
  wallTimeNs @2 :UInt64;
  # CLOCK_MONOTONIC at the same instant, to map logMonoTime to wall time.
  monoTimeNs @3 :UInt64;
  hostname @4 :Text;
  # Index of this segment in its recording (0 for the first).
  segmentNum @5 :UInt32;
  # Identifies the recording all segments belong to.
  recordingId @6 :Text;
  # Free-form key/value metadata (command line, git revision, ...).
  metadata @7 :List(KeyValue);
}

struct KeyValue {
  key @0 :Text;
  value @1 :Text;
}

# --- sensors -----------------------------------------------------------------------

struct TemperatureSensor {
  timestampNs @0 :UInt64;
  # Board or ambient temperature.
  temperatureCelsius @1 :Float32;
  sensorName @2 :Text;
}

# Raw GNSS measurements of one receiver epoch.
struct GnssMeasurements {
  # Receiver time of the epoch: GPS week and seconds into it.
  gpsWeek @0 :UInt16;
  gpsTimeOfWeek @1 :Float64;
  measurements @2 :List(SatelliteMeasurement);

  struct SatelliteMeasurement {
    constellation @0 :Constellation;
    satelliteId @1 :UInt16;
    # Carrier-to-noise density, dB-Hz.
    cn0DbHz @2 :Float32;
    pseudorange @3 :Float64;
    pseudorangeStd @4 :Float32;
    # Doppler-derived range rate.
    pseudorangeRate @5 :Float32;
    carrierPhaseCycles @6 :Float64;
    elevationDeg @7 :Float32;
    azimuthDeg @8 :Float32;
    used @9 :Bool;
  }

  enum Constellation {
    gps @0;
    glonass @1;
    galileo @2;
    beidou @3;
    qzss @4;
    sbas @5;
  }
}

# Fused position fix (from the receiver or a GNSS/INS filter).
struct GpsLocation {
  latitudeDeg @0 :Float64;
  longitudeDeg @1 :Float64;
  # Height above the WGS84 ellipsoid.
  altitude @2 :Float64;
  speed @3 :Float32;
  bearingDeg @4 :Float32;
  # North, east, down velocity.
  velocityNed @5 :Vector3;
  # 1-sigma horizontal and vertical position accuracy.
  horizontalAccuracy @6 :Float32;
  verticalAccuracy @7 :Float32;
  speedAccuracy @8 :Float32;
  bearingAccuracyDeg @9 :Float32;
  unixTimestampMs @10 :Int64;
  satelliteCount @11 :UInt8;
  fixType @12 :FixType;
  source @13 :Text;

  enum FixType {
    none @0;
    fix2d @1;
    fix3d @2;
    dgps @3;
    rtkFloat @4;
    rtkFixed @5;
  }
}

# --- CAN bus -----------------------------------------------------------------------

struct CanFrame {
  # 11- or 29-bit arbitration id.
  address @0 :UInt32;
  dat @1 :Data;
  # Bus number on the interface board.
  bus @2 :UInt8;
  extended @3 :Bool;
  # Frame was sent by us and echoed back.
  echo @4 :Bool;
  # Receive time on the interface (CLOCK_MONOTONIC ns; 0 when unknown).
  busTimeNs @5 :UInt64;
}

# --- vehicle -----------------------------------------------------------------------

struct VehicleState {
  # Speed over ground estimated from wheel speeds.
  speed @0 :Float32;
  acceleration @1 :Float32;
  yawRate @2 :Float32;
  steeringAngleDeg @3 :Float32;
  steeringRateDeg @4 :Float32;
  # Driver torque on the steering wheel, N*m.
  steeringTorque @5 :Float32;
  wheelSpeeds @6 :WheelSpeeds;
  # Pedal positions, 0..1.
  gas @7 :Float32;
  brake @8 :Float32;
  gasPressed @9 :Bool;
  brakePressed @10 :Bool;
  steeringPressed @11 :Bool;
  standstill @12 :Bool;
  gear @13 :Gear;
  doorOpen @14 :Bool;
  seatbeltUnlatched @15 :Bool;
  leftBlinker @16 :Bool;
  rightBlinker @17 :Bool;
  cruiseState @18 :CruiseState;
  # Driver or system faults reported by the vehicle.
  faults @19 :List(Text);

  struct WheelSpeeds {
    frontLeft @0 :Float32;
    frontRight @1 :Float32;
    rearLeft @2 :Float32;
    rearRight @3 :Float32;
  }

  struct CruiseState {
    enabled @0 :Bool;
    available @1 :Bool;
    setSpeed @2 :Float32;
    standstill @3 :Bool;
  }

  enum Gear {
    unknown @0;
    park @1;
    reverse @2;
    neutral @3;
    drive @4;
    sport @5;
    low @6;
  }
}

# Static description of the vehicle, published once at start (and on change).
struct VehicleParams {
  make @0 :Text;
  model @1 :Text;
  fingerprint @2 :Text;
  mass @3 :Float32;
  wheelbase @4 :Float32;
  steerRatio @5 :Float32;
  centerToFront @6 :Float32;
  maxLateralAcceleration @7 :Float32;
  steerControlType @8 :SteerControlType;

  enum SteerControlType {
    torque @0;
    angle @1;
  }
}

# --- control -----------------------------------------------------------------------

struct ControlCommand {
  enabled @0 :Bool;
  latActive @1 :Bool;
  longActive @2 :Bool;
  # Desired longitudinal acceleration.
  accel @3 :Float32;
  # Normalized steering torque, -1..1.
  steerTorque @4 :Float32;
  steeringAngleDeg @5 :Float32;
  # Desired path curvature, 1/m.
  curvature @6 :Float32;
  hudAlert @7 :Alert;

  enum Alert {
    none @0;
    takeControl @1;
    steerLimit @2;
    fcw @3;
  }
}

struct ControllerState {
  state @0 :State;
  enabled @1 :Bool;
  active @2 :Bool;
  # Speed the controller targets.
  vCruise @3 :Float32;
  # Lateral controller terms.
  lateral @4 :PidState;
  longitudinal @5 :PidState;
  # Processing time of the last control step.
  cumLagMs @6 :Float32;
  alertText @7 :Text;
  # Control loop iteration counter.
  step @8 :UInt64;

  struct PidState {
    active @0 :Bool;
    error @1 :Float32;
    p @2 :Float32;
    i @3 :Float32;
    f @4 :Float32;
    output @5 :Float32;
    saturated @6 :Bool;
  }

  enum State {
    disabled @0;
    preEnabled @1;
    enabled @2;
    softDisabling @3;
    overriding @4;
  }
}

# --- planning, perception, localization ---------------------------------------------

struct Plan {
  # Time of the model frame this plan was made from.
  modelMonoTime @0 :UInt64;
  # Trajectory samples at times t (s from now).
  t @1 :List(Float32);
  x @2 :List(Float32);
  y @3 :List(Float32);
  speeds @4 :List(Float32);
  accels @5 :List(Float32);
  curvatures @6 :List(Float32);
  desiredCurvature @7 :Float32;
  hasLead @8 :Bool;
  solverExecutionTimeMs @9 :Float32;
  source @10 :Source;

  enum Source {
    cruise @0;
    lead0 @1;
    lead1 @2;
    stop @3;
  }
}

struct ModelOutput {
  frameId @0 :UInt32;
  # Frames the model skipped since the previous output.
  frameDropPerc @1 :Float32;
  timestampEof @2 :UInt64;
  executionTimeMs @3 :Float32;
  # Predicted path: x, y per sample point.
  path @4 :Polyline;
  laneLines @5 :List(Polyline);
  laneLineProbs @6 :List(Float32);
  roadEdges @7 :List(Polyline);
  leads @8 :List(Lead);
  objects @9 :List(DetectedObject);
  # Raw network output for debugging (float32 little-endian).
  rawOutput @10 :Data;

  struct Polyline {
    x @0 :List(Float32);
    y @1 :List(Float32);
    z @2 :List(Float32);
    std @3 :List(Float32);
  }

  struct Lead {
    # Distance, lateral offset and relative speed of the lead vehicle.
    dRel @0 :Float32;
    yRel @1 :Float32;
    vRel @2 :Float32;
    aRel @3 :Float32;
    prob @4 :Float32;
  }

  struct DetectedObject {
    kind @0 :Kind;
    position @1 :Vector3;
    size @2 :Vector3;
    velocity @3 :Vector3;
    confidence @4 :Float32;
    trackId @5 :UInt32;

    enum Kind {
      unknown @0;
      car @1;
      truck @2;
      pedestrian @3;
      cyclist @4;
      trafficSign @5;
    }
  }
}

struct RadarState {
  # Times of the CAN messages the tracks came from.
  canMonoTimes @0 :List(UInt64);
  tracks @1 :List(RadarTrack);
  errors @2 :List(Text);

  struct RadarTrack {
    trackId @0 :UInt32;
    # Longitudinal distance, lateral offset, relative speed and acceleration.
    dRel @1 :Float32;
    yRel @2 :Float32;
    vRel @3 :Float32;
    aRel @4 :Float32;
    measured @5 :Bool;
  }
}

# Pose of the body in the local (NED, origin at start) and global (ECEF) frames.
struct Localization {
  positionEcef @0 :Measurement3;
  positionNed @1 :Measurement3;
  # Roll, pitch, yaw of the body in the NED frame (rad).
  orientationNed @2 :Measurement3;
  velocityDevice @3 :Measurement3;
  accelerationDevice @4 :Measurement3;
  angularVelocityDevice @5 :Measurement3;
  gpsOk @6 :Bool;
  sensorsOk @7 :Bool;
  inputsOk @8 :Bool;
  status @9 :Status;
  # Time since the filter was (re)initialized.
  uptime @10 :Float32;

  enum Status {
    uninitialized @0;
    uncalibrated @1;
    valid @2;
  }
}

# Extrinsic calibration of the road camera relative to the vehicle.
struct Calibration {
  # Roll, pitch, yaw (rad) of the camera in the vehicle frame.
  rpyCalib @0 :List(Float32);
  rpyCalibSpread @1 :List(Float32);
  # Camera height above the road.
  height @2 :Float32;
  calPerc @3 :Int8;
  validBlocks @4 :Int32;
  status @5 :Status;

  enum Status {
    uncalibrated @0;
    calibrated @1;
    invalid @2;
    recalibrating @3;
  }
}

# --- cameras -----------------------------------------------------------------------

# Metadata of one camera frame (the pixels go through VisionIPC).
struct FrameData {
  frameId @0 :UInt32;
  # Start and end of the frame's exposure readout (CLOCK_MONOTONIC ns).
  timestampSof @1 :UInt64;
  timestampEof @2 :UInt64;
  # Exposure time.
  integrationLines @3 :Int32;
  exposureTimeMs @4 :Float32;
  gain @5 :Float32;
  # Measured scene brightness, 0..1.
  measuredGreyFraction @6 :Float32;
  targetGreyFraction @7 :Float32;
  sensor @8 :ImageSensor;
  # Frame transform applied by the ISP (row-major 3x3).
  transform @9 :List(Float32);
  processingTimeMs @10 :Float32;

  enum ImageSensor {
    unknown @0;
    ar0231 @1;
    ox03c10 @2;
    os04c10 @3;
  }
}

# Where an encoded camera frame landed in the video files.
struct EncodeIndex {
  frameId @0 :UInt32;
  type @1 :Type;
  # Frame number within the encoder's output since it started.
  encodeId @2 :UInt32;
  segmentNum @3 :Int32;
  # Index of the frame within its segment file.
  segmentId @4 :UInt32;
  segmentIdEncode @5 :UInt32;
  timestampSof @6 :UInt64;
  timestampEof @7 :UInt64;
  flags @8 :UInt32;
  len @9 :UInt32;

  enum Type {
    bigBoxLossless @0;
    fullHevc @1;
    qcameraH264 @2;
    livestreamH264 @3;
  }
}

# --- device, power, processes ----------------------------------------------------------

struct DeviceState {
  # Per-core CPU usage, percent.
  cpuUsagePercent @0 :List(Int8);
  cpuTempCelsius @1 :List(Float32);
  gpuTempCelsius @2 :List(Float32);
  memoryUsagePercent @3 :Int8;
  freeSpacePercent @4 :Float32;
  # Power drawn by the whole device.
  powerDraw @5 :Float32;
  fanSpeedPercentDesired @6 :UInt16;
  thermalStatus @7 :ThermalStatus;
  networkType @8 :NetworkType;
  networkStrength @9 :Int8;
  startedMonoTime @10 :UInt64;
  started @11 :Bool;

  enum ThermalStatus {
    green @0;
    yellow @1;
    red @2;
    danger @3;
  }

  enum NetworkType {
    none @0;
    wifi @1;
    cell3G @2;
    cell4G @3;
    cell5G @4;
    ethernet @5;
  }
}

struct PowerState {
  # Supply voltage and current into the device.
  voltage @0 :Float32;
  current @1 :Float32;
  batteryPercent @2 :Int8;
  charging @3 :Bool;
  ignitionLine @4 :Bool;
  ignitionCan @5 :Bool;
  # Energy used since start, J.
  energyUsed @6 :Float32;
  faults @7 :List(Text);
}

struct ManagerState {
  processes @0 :List(ProcessState);

  struct ProcessState {
    name @0 :Text;
    pid @1 :Int32;
    running @2 :Bool;
    shouldBeRunning @3 :Bool;
    exitCode @4 :Int32;
    # Resident memory and CPU use of the process.
    memoryBytes @5 :UInt64;
    cpuPercent @6 :Float32;
    restarts @7 :UInt32;
  }
}

# --- logs, parameters, misc --------------------------------------------------------

struct LogMessage {
  level @0 :Level;
  # Name of the process (or logger) that wrote it.
  source @1 :Text;
  text @2 :Text;
  # Source location, when known.
  filename @3 :Text;
  lineno @4 :UInt32;
  wallTimeNs @5 :UInt64;

  enum Level {
    debug @0;
    info @1;
    warning @2;
    error @3;
    critical @4;
  }
}

# A change of runtime parameters (one event per change, with every key that changed).
struct ParamsUpdate {
  entries @0 :List(Entry);

  struct Entry {
    key @0 :Text;
    value @1 :Data;
    # True when the key was removed.
    deleted @2 :Bool;
  }
}

struct DriverMonitoring {
  frameId @0 :UInt32;
  faceDetected @1 :Bool;
  # Face orientation (rad) and position in the driver camera frame.
  faceOrientation @2 :Vector3;
  facePosition @3 :Vector3;
  eyesClosedProb @4 :Float32;
  distractedProb @5 :Float32;
  awarenessStatus @6 :Float32;
  isDistracted @7 :Bool;
}

# Clocks read at the same instant, to relate the time bases.
struct Clocks {
  wallTimeNs @0 :UInt64;
  monotonicNs @1 :UInt64;
  bootTimeNs @2 :UInt64;
  modemUptimeMs @3 :UInt64;
}

struct UserBookmark {
  # Optional note typed by the user.
  note @0 :Text;
}

# --- the root ----------------------------------------------------------------------

struct Event {
  # When the event was created (CLOCK_MONOTONIC ns).
  logMonoTime @0 :UInt64;
  # The sender vouches for the content (its inputs were alive and valid).
  valid @1 :Bool;

  union {
    logStart @2 :LogStart;

    # Sensors.
    gyroscope @3 :SensorSample;
    accelerometer @4 :SensorSample;
    magnetometer @5 :SensorSample;
    temperatureSensor @6 :TemperatureSensor;
    gnssMeasurements @7 :GnssMeasurements;
    gpsLocation @8 :GpsLocation;

    # CAN bus in (received) and out (to send).
    can @9 :List(CanFrame);
    sendcan @10 :List(CanFrame);

    # Vehicle and control.
    vehicleState @11 :VehicleState;
    vehicleParams @12 :VehicleParams;
    controlCommand @13 :ControlCommand;
    controllerState @14 :ControllerState;

    # Planning, perception, localization.
    plan @15 :Plan;
    modelOutput @16 :ModelOutput;
    radarState @17 :RadarState;
    localization @18 :Localization;
    calibration @19 :Calibration;
    driverMonitoring @20 :DriverMonitoring;

    # Cameras: frame metadata and encoder indices.
    roadCameraState @21 :FrameData;
    driverCameraState @22 :FrameData;
    wideRoadCameraState @23 :FrameData;
    roadEncodeIdx @24 :EncodeIndex;
    driverEncodeIdx @25 :EncodeIndex;
    wideRoadEncodeIdx @26 :EncodeIndex;

    # Device and processes.
    deviceState @27 :DeviceState;
    powerState @28 :PowerState;
    managerState @29 :ManagerState;
    clocks @30 :Clocks;

    # Logs and parameters.
    logMessage @31 :LogMessage;
    errorLogMessage @32 :LogMessage;
    params @33 :ParamsUpdate;
    userBookmark @34 :UserBookmark;

    # Reserved for applications (see custom.capnp).
    customReserved0 @35 :Custom.CustomReserved0;
    customReserved1 @36 :Custom.CustomReserved1;
    customReserved2 @37 :Custom.CustomReserved2;
    customReserved3 @38 :Custom.CustomReserved3;
    customReserved4 @39 :Custom.CustomReserved4;
    customReserved5 @40 :Custom.CustomReserved5;
    customReserved6 @41 :Custom.CustomReserved6;
    customReserved7 @42 :Custom.CustomReserved7;
    customReserved8 @43 :Custom.CustomReserved8;
    customReserved9 @44 :Custom.CustomReserved9;
  }
}
