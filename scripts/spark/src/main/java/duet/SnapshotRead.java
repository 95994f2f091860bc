package duet;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.count;
import static org.apache.spark.sql.functions.countDistinct;
import static org.apache.spark.sql.functions.sum;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;

/**
 * Reads collection {@code items} of a database name such as {@code shop@nightly}
 * (a duet named snapshot) with the MongoDB Spark connector on {@code local[2]},
 * in several partitions read in parallel, and prints one line:
 * {@code RESULT partitions=P count=N distinct_ids=D sum_n=S}.
 *
 * <p>Arguments: the connection string, the database name, the partition size
 * in MB (small, so that a small collection still splits into partitions).
 */
public final class SnapshotRead {
  public static void main(String[] args) {
    String uri = args[0];
    String database = args[1];
    String partitionMb = args.length > 2 ? args[2] : "1";
    SparkSession spark =
        SparkSession.builder()
            .appName("duet-snapshot-read")
            .master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate();
    spark.sparkContext().setLogLevel("WARN");
    try {
      Dataset<Row> items =
          spark
              .read()
              .format("mongodb")
              .option("connection.uri", uri)
              .option("database", database)
              .option("collection", "items")
              .option(
                  "partitioner",
                  "com.mongodb.spark.sql.connector.read.partitioner.SamplePartitioner")
              .option("partitioner.options.partition.size", partitionMb)
              .option("partitioner.options.samples.per.partition", "20")
              .load();
      int partitions = items.rdd().getNumPartitions();
      Row r =
          items
              .agg(count(col("_id")), countDistinct(col("_id")), sum(col("n")))
              .collectAsList()
              .get(0);
      System.out.println(
          "RESULT partitions="
              + partitions
              + " count="
              + r.getLong(0)
              + " distinct_ids="
              + r.getLong(1)
              + " sum_n="
              + r.getLong(2));
    } finally {
      spark.stop();
    }
  }
}
