import java.util.*;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.*;

/**
 * The Java admin client moving a replica between log dirs (tests/broker/test_log_dirs.py): alterReplicaLogDirs to
 * an unknown dir and to the destination, then describeReplicaLogDirs until the move is done, one line per fact:
 *   X exception-of-the-unknown-dir   F future-dir lag (each time a future replica is seen)   C current-dir
 */
public class LogDirsAdmin {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], dest = args[2], bogus = args[3];
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        TopicPartitionReplica replica = new TopicPartitionReplica(topic, 0, 0);
        try (Admin admin = Admin.create(props)) {
            try {
                admin.alterReplicaLogDirs(Map.of(replica, bogus)).all().get();
                System.out.println("X none");
            } catch (ExecutionException e) {
                System.out.println("X " + e.getCause().getClass().getSimpleName());
            }
            admin.alterReplicaLogDirs(Map.of(replica, dest)).all().get();
            long deadline = System.currentTimeMillis() + 60000;
            while (System.currentTimeMillis() < deadline) {
                DescribeReplicaLogDirsResult.ReplicaLogDirInfo info =
                        admin.describeReplicaLogDirs(List.of(replica)).all().get().get(replica);
                if (info.getFutureReplicaLogDir() != null) {
                    System.out.println("F " + info.getFutureReplicaLogDir() + " " + info.getFutureReplicaOffsetLag());
                } else if (dest.equals(info.getCurrentReplicaLogDir())) {
                    System.out.println("C " + info.getCurrentReplicaLogDir());
                    return;
                }
                Thread.sleep(100);
            }
            System.out.println("C timeout");
        }
    }
}
