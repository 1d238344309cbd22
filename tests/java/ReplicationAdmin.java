import java.util.*;
import java.util.stream.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.*;

/**
 * The Java admin client's view of a replicated topic (tests/coordinator/test_replication_control.py):
 * describeTopics (DescribeTopicPartitions or Metadata, as the client chooses), describeCluster, describeLogDirs
 * and a preferred-leader election, one line per fact:
 *   P partition leader replicas isr   C controller   D broker partitions-of-topic   E partition result
 */
public class ReplicationAdmin {
    static String ids(List<Node> nodes) {
        return nodes.stream().map(n -> Integer.toString(n.id())).collect(Collectors.joining(","));
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1];
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
            for (TopicPartitionInfo p : d.partitions()) {
                System.out.println("P " + p.partition() + " " + (p.leader() == null ? -1 : p.leader().id()) + " "
                        + ids(p.replicas()) + " " + ids(p.isr()));
            }
            DescribeClusterResult cluster = admin.describeCluster();
            System.out.println("C " + cluster.controller().get().id());
            List<Integer> brokers = cluster.nodes().get().stream().map(Node::id).sorted().collect(Collectors.toList());
            Map<Integer, Map<String, LogDirDescription>> dirs = admin.describeLogDirs(brokers).allDescriptions().get();
            for (int b : brokers) {
                long n = dirs.get(b).values().stream().flatMap(ld -> ld.replicaInfos().keySet().stream())
                        .filter(tp -> tp.topic().equals(topic)).count();
                System.out.println("D " + b + " " + n);
            }
            Set<TopicPartition> all = d.partitions().stream().map(p -> new TopicPartition(topic, p.partition()))
                    .collect(Collectors.toSet());
            Map<TopicPartition, Optional<Throwable>> elected =
                    admin.electLeaders(ElectionType.PREFERRED, all).partitions().get();
            for (Map.Entry<TopicPartition, Optional<Throwable>> e : elected.entrySet()) {
                System.out.println("E " + e.getKey().partition() + " "
                        + e.getValue().map(t -> t.getClass().getSimpleName()).orElse("elected"));
            }
        }
    }
}
